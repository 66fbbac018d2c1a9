"""An unreachable Redis's message hints at TLS where the URL's scheme may not be the port's.
A QA run: a ``rediss://`` URL of a plain port ("timed out"), a ``redis://`` URL of a TLS port
and a ``rediss://`` URL without the client certificate the server asks for ("Connection
reset by peer") said nothing of TLS, in the workers' log and in the CLI."""

from __future__ import annotations

import pytest
from scrapy.settings import Settings

from scrapy_ha.cli.runner import reachable
from scrapy_ha.store.connection import (
    RedisDown,
    RedisUnavailable,
    check_reachable,
    redis_from_settings,
)
from tests import cli_seed, redis_servers

NOT_TLS = "if redis-server there is not TLS, the URL is redis://"
TLS = "if redis-server there speaks TLS (tls-port), the URL is rediss://"
CERTIFICATE = "give REDIS_TLS_CERT_FILE and REDIS_TLS_KEY_FILE"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("tls_hint")
    tls = redis_servers.start_tls(directory / "tls", redis_servers.make_tls_files(directory))
    plain = redis_servers.start(directory / "plain")
    yield plain.port, tls.port
    tls.kill()
    plain.kill()


def _messages(url: str) -> tuple[str, str]:
    """What a worker (its start's reason) and the CLI say of *url*."""

    async def both() -> tuple[str, str]:
        settings = Settings({"REDIS_URL": url})
        client = redis_from_settings(settings, connect_timeout=1)
        try:
            with pytest.raises(RedisDown) as worker:
                await check_reachable(client, url, 1.5)
        finally:
            await client.aclose()
        client = redis_from_settings(settings, connect_timeout=1)
        try:
            with pytest.raises(RedisUnavailable) as cli:
                await reachable(client, url)
        finally:
            await client.aclose()
        return worker.value.reason, str(cli.value)

    return cli_seed._run(both())


def test_a_tls_url_of_a_plain_port_hints_at_redis(servers):
    plain, _ = servers
    for said in _messages(f"rediss://127.0.0.1:{plain}/0"):
        assert NOT_TLS in said, said


def test_a_plain_url_of_a_tls_port_hints_at_rediss(servers):
    _, tls = servers
    for said in _messages(f"redis://127.0.0.1:{tls}/0"):
        assert TLS in said and "reset" in said, said


def test_a_tls_url_without_a_client_certificate_hints_at_one(servers):
    _, tls = servers
    for said in _messages(f"rediss://127.0.0.1:{tls}/0?ssl_cert_reqs=none"):
        assert CERTIFICATE in said, said
        assert TLS not in said and NOT_TLS not in said, said


def test_a_closed_port_hints_at_nothing_of_tls():
    port = redis_servers.free_port()
    for url in (f"redis://127.0.0.1:{port}/0", f"rediss://127.0.0.1:{port}/0"):
        for said in _messages(url):
            assert "TLS" not in said and "111" in said, said


def test_the_hint_reads_the_sentinel_and_cluster_schemes_too():
    """A review: ``rediss+sentinel://`` and ``rediss+cluster://`` URLs got no hint."""
    from scrapy_ha.store.tls_hint import tls_hint

    timed_out = TimeoutError()
    reset = ConnectionResetError(104, "Connection reset by peer")
    assert NOT_TLS in tls_hint(timed_out, "rediss+sentinel://h:26379/service")
    assert CERTIFICATE in tls_hint(reset, "rediss+cluster://h:7000")
    assert TLS in tls_hint(reset, "redis+cluster://h:7000")
    assert tls_hint(timed_out, "redis+sentinel://h:26379/service") == ""
