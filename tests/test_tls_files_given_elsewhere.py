"""The TLS files checked at start are those the client gets: a key given in REDIS_PARAMS
(scrapy-redis's way) beside REDIS_TLS_CERT_FILE, or an encrypted key's password in the
URL's query (redis-py reads ``?ssl_password=``), connected before the check and failed the
start after it (a review: "does not load as a client certificate and its key")."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from scrapy.settings import Settings

from scrapy_ha.store.url import RedisConfigError, sync_client, target_from_settings
from tests import redis_servers

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

Tls = tuple[redis_servers.TlsFiles, str]


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tls]:
    root = tmp_path_factory.mktemp("tls-elsewhere")
    files = redis_servers.make_tls_files(root / "files")
    server = redis_servers.start_tls(root / "server", files)
    yield files, f"rediss://127.0.0.1:{server.port}/0"
    server.kill()


def _ping(settings: Settings) -> bool:
    client = sync_client(settings, connect_timeout=5)
    try:
        return bool(client.ping())
    finally:
        client.close()


def test_a_key_given_in_redis_params_beside_the_cert_setting_is_taken(tls: Tls) -> None:
    files, url = tls
    settings = Settings(
        {
            "REDIS_URL": url,
            "REDIS_TLS_CA_FILE": str(files.ca),
            "REDIS_TLS_CERT_FILE": str(files.client_cert),
            "REDIS_PARAMS": {"ssl_keyfile": str(files.client_key)},
        }
    )
    assert _ping(settings)


def test_a_bad_key_given_in_redis_params_is_refused_naming_it(tls: Tls) -> None:
    files, url = tls
    settings = Settings(
        {
            "REDIS_URL": url,
            "REDIS_TLS_CERT_FILE": str(files.client_cert),
            "REDIS_PARAMS": {"ssl_keyfile": str(files.server_key)},
        }
    )
    with pytest.raises(RedisConfigError, match=r"REDIS_PARAMS\['ssl_keyfile'\]="):
        target_from_settings(settings)


def test_an_encrypted_keys_password_in_the_url_is_taken(tls: Tls, tmp_path: Path) -> None:
    files, url = tls
    key = tmp_path / "encrypted.key"
    redis_servers._openssl(
        "pkey", "-in", files.client_key, "-out", key, "-aes256", "-passout", "pass:secret"
    )
    given = {
        "REDIS_TLS_CA_FILE": str(files.ca),
        "REDIS_TLS_CERT_FILE": str(files.client_cert),
        "REDIS_TLS_KEY_FILE": str(key),
    }
    assert _ping(Settings({"REDIS_URL": f"{url}?ssl_password=secret", **given}))
    with pytest.raises(RedisConfigError, match="ssl_password"):
        target_from_settings(Settings({"REDIS_URL": url, **given}))
