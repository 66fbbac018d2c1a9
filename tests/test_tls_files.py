"""A TLS file that exists but is not what its setting says is refused at start naming the
setting: before, a certificate given as REDIS_TLS_KEY_FILE was taken for a Redis that does
not answer ("unreachable ... [SSL] PEM lib"), again and again for HA_START_TIMEOUT."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from scrapy.settings import Settings

from scrapy_ha.store.url import RedisConfigError, target_from_settings
from tests import redis_servers

if TYPE_CHECKING:
    from pathlib import Path

URL = "rediss://:hunter2@127.0.0.1:6380/0"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> redis_servers.TlsFiles:
    return redis_servers.make_tls_files(tmp_path_factory.mktemp("tls"))


def _settings(files: redis_servers.TlsFiles, **tls: object) -> Settings:
    given = {
        "REDIS_TLS_CA_FILE": str(files.ca),
        "REDIS_TLS_CERT_FILE": str(files.client_cert),
        "REDIS_TLS_KEY_FILE": str(files.client_key),
    }
    given.update({name: value for name, value in tls.items() if value is not None})
    return Settings({"REDIS_URL": URL, **{k: v for k, v in given.items() if v != ""}})


def test_files_that_load_are_passed_to_the_client(files):
    params = target_from_settings(_settings(files)).params
    assert params["ssl_keyfile"] == str(files.client_key)
    assert params["ssl_certfile"] == str(files.client_cert)


@pytest.mark.parametrize(
    ("tls", "named"),
    [
        ({"REDIS_TLS_KEY_FILE": "ca"}, "REDIS_TLS_KEY_FILE="),
        ({"REDIS_TLS_KEY_FILE": "server_key"}, "do not load as a client certificate and its key"),
        ({"REDIS_TLS_CERT_FILE": "client_key"}, "REDIS_TLS_CERT_FILE="),
        ({"REDIS_TLS_CA_FILE": "client_key"}, "REDIS_TLS_CA_FILE="),
        ({"REDIS_TLS_CERT_FILE": ""}, "REDIS_TLS_KEY_FILE="),
    ],
)
def test_a_file_that_is_not_what_its_setting_says_is_refused_naming_it(files, tls, named):
    tls = {name: str(getattr(files, value)) if value else "" for name, value in tls.items()}
    with pytest.raises(RedisConfigError) as refused:
        target_from_settings(_settings(files, **tls))
    message = str(refused.value)
    assert named in message, message
    assert "hunter2" not in message and "rediss://:***@127.0.0.1:6380/0" in message


def test_an_encrypted_key_without_its_password_is_refused_not_asked_for(files, tmp_path: Path):
    key = tmp_path / "encrypted.key"
    redis_servers._openssl(
        "pkey", "-in", files.client_key, "-out", key, "-aes256", "-passout", "pass:secret"
    )
    with pytest.raises(RedisConfigError, match="ssl_password"):
        target_from_settings(_settings(files, REDIS_TLS_KEY_FILE=str(key)))
    settings = _settings(files, REDIS_TLS_KEY_FILE=str(key))
    settings.set("REDIS_PARAMS", {"ssl_password": "secret"})
    assert target_from_settings(settings).params["ssl_keyfile"] == str(key)
