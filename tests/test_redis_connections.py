"""Every way of naming the crawl's Redis reaches it: rediss:// with a CA and a client
certificate and an ACL user, a Unix socket, Sentinel and Cluster URLs and settings; a bad
URL or setting is refused naming it, with the password masked."""

from __future__ import annotations

import datetime
import ipaddress
import json
import logging
import ssl
from typing import TYPE_CHECKING

import pytest
import redis.asyncio
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.demo.harness import free_port
from scrapy_ha.store.connection import redis_from_settings, sync_redis_from_settings
from scrapy_ha.store.url import (
    RedisConfigError,
    parse_url,
    target_from_settings,
    uses_cluster,
)
from tests import redis_servers
from tests.scrapy_project import write_project
from tests.spiders import CatalogueSpider
from tests.test_cli import scrapy_ha

if TYPE_CHECKING:
    from pathlib import Path

    from scrapy.crawler import Crawler

#: The ACL user the crawl runs as: every command, but only the crawl's keys.
ACL_USER = ["crawler", "on", ">s3cret", "~ha:*", "&*", "+@all"]


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


def crawl_settings(**extra):
    return {
        "SCHEDULER": "scrapy_ha.Scheduler",
        "HA_IDLE_TIMEOUT": 0.3,
        "SCHEDULER_PERSIST": True,
        "LOG_LEVEL": "INFO",
        **extra,
    }


# -- URLs and settings --------------------------------------------------------------------


def test_a_sentinel_url_names_the_sentinels_the_service_and_the_database():
    target = parse_url("redis+sentinel://:pw@10.0.0.1:26380,10.0.0.2/books/3")
    assert target.mode == "sentinel"
    assert target.nodes == (("10.0.0.1", 26380), ("10.0.0.2", 26379))
    assert (target.service, target.db, target.password) == ("books", 3, "pw")
    assert "pw" not in target.display and "***" in target.display


def test_sentinel_and_cluster_settings_name_the_nodes():
    sentinel = target_from_settings(
        Settings({"REDIS_SENTINELS": ["a:1", "b:2"], "REDIS_SENTINEL_SERVICE": "s"})
    )
    assert (sentinel.mode, sentinel.nodes, sentinel.service) == (
        "sentinel",
        (("a", 1), ("b", 2)),
        "s",
    )
    cluster = target_from_settings(Settings({"REDIS_CLUSTER_NODES": "a:7000, b:7001"}))
    assert (cluster.mode, cluster.nodes) == ("cluster", (("a", 7000), ("b", 7001)))
    assert uses_cluster(Settings({"REDIS_CLUSTER_NODES": "a:7000"}))
    assert uses_cluster(Settings({"REDIS_URL": "redis+cluster://a:7000"}))
    assert not uses_cluster(Settings({"REDIS_URL": "redis://a:7000/0"}))


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"REDIS_URL": "memcache://u:hunter2@h/0"}, "unknown scheme"),
        ({"REDIS_URL": "redis+cluster://u:hunter2@h:7000/2"}, "database 0 only"),
        ({"REDIS_URL": "redis+sentinel://u:hunter2@h:1"}, "/<service>"),
        ({"REDIS_SENTINELS": "h:1"}, "REDIS_SENTINEL_SERVICE"),
        ({"REDIS_URL": "redis://u:hunter2@h/0", "REDIS_TLS_CA_FILE": "/ca"}, "rediss://"),
        (
            {"REDIS_URL": "rediss://u:hunter2@h/0", "REDIS_TLS_CA_FILE": "/no/ca.pem"},
            "REDIS_TLS_CA_FILE='/no/ca.pem': no such file (for Redis at rediss://u:***@h/0)",
        ),
        (
            {"REDIS_URL": "rediss+sentinel://h/s/0", "REDIS_TLS_KEY_FILE": "/etc"},
            "REDIS_TLS_KEY_FILE='/etc': no such file",
        ),
        # a traceback at the first command (or "check REDIS_URL"), before
        ({"REDIS_PARAMS": "notadict"}, "REDIS_PARAMS='notadict' must be a dict"),
        ({"REDIS_PARAMS": {"socket_timeout": "abc"}}, "['socket_timeout']='abc' must be sec"),
        ({"REDIS_ENCODING": "nosuchenc"}, "REDIS_ENCODING='nosuchenc' is not a text encod"),
        ({"REDIS_ENCODING": "base64"}, "REDIS_ENCODING='base64' is not a text encoding"),
        ({"REDIS_PARAMS": {"encoding": "rot13"}}, "['encoding']='rot13' is not a text"),
        ({"REDIS_URL": "redis://u:hunter2@h:1/abc"}, "its path is not a database number"),
        ({"REDIS_URL": "redis://:x/hunter2@h:1/0"}, "'/' must be percent-encoded"),
        # a QA run: redis-py's error quoted the password's start as a port, or connected to
        # it as a host ("connecting to hunter2:6379"); bad values blamed on another setting
        ({"REDIS_URL": "redis://:hunter2#x@h:1/0"}, "REDIS_URL 'redis://***@h:1/0': its host"),
        ({"REDIS_URL": "redis://:hunter2?x@h:1/0"}, "'#', '?' or '/' must be percent-encoded"),
        ({"REDIS_URL": "redis://u:12/hunter2@h:1/0"}, "REDIS_URL 'redis://***@h:1/0': its"),
        ({"REDIS_URL": "redis+cluster://:hunter2#x@h:1,g:2"}, "its host and port cannot be"),
        ({"REDIS_URL": "redis+cluster://:hunter2?x@h:1,g:2"}, "its host and port cannot be"),
        ({"REDIS_URL": "redis+sentinel://:hunter2#x@h:1/s"}, "its host and port cannot be"),
        ({"REDIS_URL": "redis://h:0/0"}, "a port is a number from 1 to 65535"),
        ({"REDIS_URL": "redis://[::1/0"}, "written in brackets"),
        ({"REDIS_PORT": "abc"}, "REDIS_PORT='abc' must be a whole number"),
        ({"REDIS_DB": "abc"}, "REDIS_DB='abc' must be a whole number"),
        ({"REDIS_PARAMS": {"socket_timeout": -1}}, "['socket_timeout']=-1 must be 0.001 or more"),
        ({"REDIS_PARAMS": {"socket_timeout": float("nan")}}, "['socket_timeout']=nan must be"),
        ({"REDIS_PARAMS": {"socket_connect_timeout": 0}}, "['socket_connect_timeout']=0 must"),
        ({"REDIS_PARAMS": {"health_check_interval": -5}}, "=-5 must be 0 (off) or at least 0.1"),
        # a QA run: a minute of "unreachable" then the start given up, named as an
        # unreachable Redis; a URL's query was not checked at all
        ({"REDIS_PARAMS": {"socket_timeout": 1e-300}}, "['socket_timeout']=1e-300 must be 0.001"),
        ({"REDIS_PARAMS": {"health_check_interval": 1e-4}}, "=0.0001 must be 0 (off) or at"),
        (
            {"REDIS_URL": "redis://h:1/0?socket_timeout=0"},
            "socket_timeout='0' must be 0.001 or more",
        ),
        ({"REDIS_URL": "redis://:hunter2@h:1/0?socket_connect_timeout=nan"}, "***@h:1/0?"),
        ({"REDIS_URL": "redis://h:1/0?socket_timeout=x"}, "socket_timeout='x' must be seconds"),
        ({"REDIS_SENTINELS": 5, "REDIS_SENTINEL_SERVICE": "s"}, "REDIS_SENTINELS=5 must be 'host"),
        ({"REDIS_CLUSTER_NODES": 5}, "REDIS_CLUSTER_NODES=5 must be 'host:port,host:port' or"),
        ({"REDIS_CLUSTER_NODES": [("h", "x")]}, "REDIS_CLUSTER_NODES: ('h', 'x') is not host:port"),
        # a review: a password with '@' then '#' connected to its middle as a host
        ({"REDIS_URL": "redis://:p@hunter2#x@h:1/0"}, "REDIS_URL 'redis://***@h:1/0': its"),
        ({"REDIS_URL": "redis+cluster://:p@hunter2?x@h:1,g:2"}, "its host and port cannot"),
        ({"REDIS_PORT": "0"}, "REDIS_PORT='0' must be 1 to 65535"),
        # a QA run: a URL whose '://' a typo lost was quoted whole, its password with it
        ({"REDIS_URL": "redis//:hunter2@h:1/0"}, "REDIS_URL 'redis//:***@h:1/0': no scheme"),
        ({"REDIS_URL": "redis:/:hunter2@h:1/0"}, "REDIS_URL 'redis:/:***@h:1/0': no scheme"),
        ({"REDIS_URL": "rediss//u:hunter2@h:1/0"}, "REDIS_URL 'rediss//u:***@h:1/0'"),
        ({"REDIS_URL": "redis//:hunter2/x@h:1/0"}, "REDIS_URL 'redis//:***@h:1/0'"),
        ({"REDIS_URL": ":hunter2@h:6379"}, "REDIS_URL ':***@h:6379': no scheme"),
        ({"REDIS_URL": "localhost:6379"}, "REDIS_URL 'localhost:6379': no scheme"),
    ],
)
def test_a_bad_url_or_setting_is_refused_naming_it_with_the_password_masked(settings, named):
    with pytest.raises(RedisConfigError) as info:
        target_from_settings(Settings(settings))
    assert named in str(info.value)
    assert "hunter2" not in str(info.value)


# -- real servers -------------------------------------------------------------------------


@pytest.fixture
def tls_server(tmp_path: Path):
    files = redis_servers.make_tls_files(tmp_path / "tls")
    server = redis_servers.start_tls(tmp_path / "redis", files)
    admin = server.client(
        ssl=True,
        ssl_ca_certs=str(files.ca),
        ssl_certfile=str(files.client_cert),
        ssl_keyfile=str(files.client_key),
    )
    admin.acl_setuser(
        "crawler",
        enabled=True,
        passwords=["+s3cret"],
        keys=["ha:*"],
        channels=["*"],
        commands=["+@all"],
    )
    admin.acl_setuser("default", enabled=False)  # only the ACL user gets in
    yield server, files
    admin.close()
    server.kill()


@deferred_f_from_coro_f
async def test_a_crawl_over_tls_with_a_client_certificate_as_an_acl_user(tls_server, site):
    server, files = tls_server
    crawler = get_crawler(
        CatalogueSpider,
        crawl_settings(
            REDIS_URL=f"rediss://crawler:s3cret@127.0.0.1:{server.port}/0",
            REDIS_TLS_CA_FILE=str(files.ca),
            REDIS_TLS_CERT_FILE=str(files.client_cert),
            REDIS_TLS_KEY_FILE=str(files.client_key),
        ),
    )
    await crawler.crawl_async(base_url=site.url)
    assert sorted(i["id"] for i in crawler.spider.items) == list(range(1, 51))
    assert crawler.stats.get_value("ha/acked") == 55


@deferred_f_from_coro_f
async def test_a_wrong_password_is_refused_naming_the_url_masked(tls_server, site, caplog):
    server, files = tls_server
    crawler = get_crawler(
        CatalogueSpider,
        crawl_settings(
            REDIS_URL=f"rediss://crawler:wrong-secret@127.0.0.1:{server.port}/0",
            REDIS_TLS_CA_FILE=str(files.ca),
            REDIS_TLS_CERT_FILE=str(files.client_cert),
            REDIS_TLS_KEY_FILE=str(files.client_key),
        ),
    )
    with caplog.at_level(logging.ERROR):
        await crawler.crawl_async(base_url=site.url)
    errors = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    assert f"rediss://crawler:***@127.0.0.1:{server.port}/0" in errors
    assert "wrong-secret" not in caplog.text


@deferred_f_from_coro_f
async def test_a_crawl_and_the_cli_over_a_unix_socket(tmp_path, site):
    sock = tmp_path / "redis.sock"
    server = redis_servers.start(tmp_path / "redis", "--unixsocket", str(sock))
    url = f"unix://{sock}?db=2"
    try:
        crawler = get_crawler(CatalogueSpider, crawl_settings(REDIS_URL=url))
        await crawler.crawl_async(base_url=site.url)
        assert len(crawler.spider.items) == 50
        result = scrapy_ha("--redis-url", url, "status", "catalogue", "--json")
        assert result.returncode == 0, result.stderr
        status = json.loads(result.stdout)
        assert status["pending"] == 0 and status["fingerprints"] == 55
    finally:
        server.kill()


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://:hunter2@127.0.0.1:{port}/books/0",
        "redis+cluster://:hunter2@127.0.0.1:{port}",
    ],
)
@deferred_f_from_coro_f
async def test_unreachable_sentinels_or_cluster_fail_the_start_naming_the_url(url, caplog):
    url = url.format(port=free_port())
    crawler = get_crawler(
        CatalogueSpider, crawl_settings(REDIS_URL=url, HA_CONNECT_TIMEOUT=2, HA_START_TIMEOUT=0)
    )
    await crawler.crawl_async(base_url="http://127.0.0.1:9")
    (error,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "cannot reach Redis at " + url.replace("hunter2", "***") in error
    assert "hunter2" not in caplog.text


def test_the_cli_refuses_a_bad_url_in_one_line_with_the_password_masked():
    result = scrapy_ha("--redis-url", "memcache://u:hunter2@127.0.0.1/0", "status", "books")
    assert result.returncode == 2
    assert result.stderr.startswith("error: REDIS_URL 'memcache://u:***@127.0.0.1/0': unknown")
    assert "hunter2" not in result.stderr + result.stdout and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("settings", "url"),
    [
        # a review: refused as a password holding '/' (a systemd instance's socket)
        ({"REDIS_URL": "unix:///run/redis@main/redis.sock"}, "unix:///run/redis@main/redis.sock"),
        ({"REDIS_URL": "redis://h:1/0?password=a@b"}, "redis://h:1/0?password=***"),
        ({"REDIS_URL": "redis://u:p%23w%40x@h:1/0"}, "redis://u:***@h:1/0"),
        ({"REDIS_HOST": "::1", "REDIS_PORT": "6390"}, "redis://[::1]:6390/0"),  # scrapy-redis's
    ],
)
def test_a_url_users_write_is_taken(settings, url):
    assert target_from_settings(Settings(settings)).display == url


@pytest.mark.parametrize("command", [["status", "books"], ["metrics", "--port", "0"]])
def test_the_cli_refuses_a_password_cut_by_a_hash_without_showing_it(command):
    # a QA run: "Port could not be cast to integer value as 'hunter2'"; metrics: a traceback
    result = scrapy_ha("--redis-url", "redis://:hunter2#x@127.0.0.1:1/0", *command)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: REDIS_URL 'redis://***@127.0.0.1:1/0': its host")
    assert "hunter2" not in result.stderr + result.stdout and "Traceback" not in result.stderr


def test_a_tool_overrides_client_arguments_over_redis_params(redis_url):
    settings = Settings({"REDIS_URL": redis_url, "REDIS_PARAMS": {"socket_timeout": 30}})
    client = sync_redis_from_settings(settings, connect_timeout=1, socket_timeout=0.5)
    try:
        assert client.connection_pool.connection_kwargs["socket_timeout"] == 0.5
        assert client.ping()
    finally:
        client.close()


class OwnAsyncRedis(redis.asyncio.Redis):
    """A user's client class, named in REDIS_PARAMS as scrapy-redis allows."""


@pytest.mark.parametrize(
    ("redis_cls", "expected"),
    [
        (None, redis.asyncio.Redis),
        ("redis.Redis", redis.asyncio.Redis),  # scrapy-redis's blocking default: not usable
        (OwnAsyncRedis, OwnAsyncRedis),
        ("tests.test_redis_connections.OwnAsyncRedis", OwnAsyncRedis),
    ],
)
@deferred_f_from_coro_f
async def test_a_client_class_of_the_users_own_is_kept(redis_url, redis_cls, expected):
    params = {"redis_cls": redis_cls} if redis_cls else {}
    settings = Settings({"REDIS_URL": redis_url, "REDIS_PARAMS": params})
    client = redis_from_settings(settings, connect_timeout=2)
    try:
        assert type(client) is expected
        assert await client.ping()
    finally:
        await client.aclose()


# -- certificates the client refuses -----------------------------------------------------


async def _crawl_over_tls(
    tmp_path: Path, site, files: redis_servers.TlsFiles, ca: Path | None = None, **extra
) -> tuple[Crawler, int]:
    """A crawl of *site* through a TLS redis-server of *files* (the client trusting *ca*,
    the server's CA by default), with the settings *extra*; the crawler and the port."""
    server = redis_servers.start_tls(tmp_path / "redis", files)
    try:
        crawler = get_crawler(
            CatalogueSpider,
            crawl_settings(
                REDIS_URL=f"rediss://127.0.0.1:{server.port}/0",
                REDIS_TLS_CA_FILE=str(ca or files.ca),
                REDIS_TLS_CERT_FILE=str(files.client_cert),
                REDIS_TLS_KEY_FILE=str(files.client_key),
                **extra,
            ),
        )
        await crawler.crawl_async(base_url=site.url)
    finally:
        server.kill()
    return crawler, server.port


@pytest.mark.parametrize(
    ("case", "advice"),
    [
        ("another CA", "check that REDIS_TLS_CA_FILE names the CA that signed"),
        ("another host", "reach Redis by a name or address its certificate lists"),
        ("strict", '{"ssl_exclude_verify_flags": [ssl.VERIFY_X509_STRICT]}'),
    ],
)
@deferred_f_from_coro_f
async def test_a_server_certificate_refused_fails_the_start_at_once_saying_why(
    tmp_path, site, caplog, case, advice
):
    """Waiting does not mend a certificate signed by a CA the worker does not know, one
    for another host, or one that strict checking refuses (Python 3.13's default, asked for
    here so that every Python checks it): the worker does not try again until
    HA_START_TIMEOUT, and its one ERROR says what to look at."""
    files = redis_servers.make_tls_files(
        tmp_path / "tls",
        strict_ca=case != "strict",
        server_san="DNS:redis.example" if case == "another host" else "IP:127.0.0.1",
    )
    other = redis_servers.make_tls_files(tmp_path / "other")
    strict = {"ssl_include_verify_flags": [ssl.VERIFY_X509_STRICT]} if case == "strict" else {}
    with caplog.at_level(logging.WARNING):
        crawler, port = await _crawl_over_tls(
            tmp_path,
            site,
            files,
            ca=other.ca if case == "another CA" else None,
            REDIS_PARAMS=strict,
            HA_START_TIMEOUT=30,
        )
    assert crawler.stats.get_value("finish_reason") == "ha_start_failed"
    (error,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert error.startswith(f"Redis at rediss://127.0.0.1:{port}/0 presented a certificate")
    assert advice in error
    assert not [r for r in caplog.records if "unreachable at start" in r.getMessage()]


def _expired_server_certificate(files: redis_servers.TlsFiles) -> None:
    """Replace the server's certificate by one of the same CA that expired yesterday."""
    from cryptography import x509  # noqa: PLC0415 (Scrapy's dependency, for this test only)
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
    from cryptography.x509.oid import NameOID  # noqa: PLC0415

    ca = x509.load_pem_x509_certificate(files.ca.read_bytes())
    ca_key = serialization.load_pem_private_key(
        (files.ca.parent / "ca.key").read_bytes(), password=None
    )
    key = serialization.load_pem_private_key(files.server_key.read_bytes(), password=None)
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "server")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=2))
        .not_valid_after(now - datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(  # what strict checking (Python 3.13's) asks of a certificate
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.public_key()),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    files.server_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


@deferred_f_from_coro_f
async def test_an_expired_server_certificate_is_tried_again_until_the_start_timeout(
    tmp_path, site, caplog
):
    """An expired certificate can be replaced while the worker waits (a clock behind mends
    too): the worker tries again, and says why each time."""
    files = redis_servers.make_tls_files(tmp_path / "tls")
    _expired_server_certificate(files)
    with caplog.at_level(logging.WARNING):
        crawler, _ = await _crawl_over_tls(tmp_path, site, files, HA_START_TIMEOUT=1)
    assert crawler.stats.get_value("finish_reason") == "ha_start_failed"
    retries = [r.getMessage() for r in caplog.records if "unreachable at start" in r.getMessage()]
    assert retries and all("certificate has expired" in m for m in retries)


def test_sentinels_check_certificates_as_redis_params_say():
    """The sentinels present certificates too: how they are checked follows REDIS_PARAMS,
    as the primary's are (the way out of strict checking reaches them)."""
    flags = {
        "ssl_exclude_verify_flags": [ssl.VERIFY_X509_STRICT],
        "ssl_check_hostname": False,
    }
    settings = Settings(
        {"REDIS_URL": "rediss+sentinel://127.0.0.1:26379/books/0", "REDIS_PARAMS": flags}
    )
    client = sync_redis_from_settings(settings, connect_timeout=1)
    try:
        (sentinel,) = client.connection_pool.sentinel_manager.sentinels
        kwargs = sentinel.connection_pool.connection_kwargs
        assert {k: kwargs.get(k) for k in flags} == flags
    finally:
        client.close()


@deferred_f_from_coro_f
async def test_the_way_out_of_strict_checking_the_error_names_works(tmp_path, site):
    """REDIS_PARAMS's ssl_exclude_verify_flags, as the error above says, lets a hand-made CA
    through strict checking (asked for as Python 3.13 does by default)."""
    files = redis_servers.make_tls_files(tmp_path / "tls", strict_ca=False)
    flags = [ssl.VERIFY_X509_STRICT]
    crawler, _ = await _crawl_over_tls(
        tmp_path,
        site,
        files,
        REDIS_PARAMS={"ssl_include_verify_flags": flags, "ssl_exclude_verify_flags": flags},
    )
    assert sorted(i["id"] for i in crawler.spider.items) == list(range(1, 51))


def test_the_cli_says_a_server_certificate_is_not_trusted(tmp_path):
    files = redis_servers.make_tls_files(tmp_path / "tls")
    other = redis_servers.make_tls_files(tmp_path / "other")
    server = redis_servers.start_tls(tmp_path / "redis", files)
    project = write_project(
        tmp_path / "project",
        "tlsproject",
        "",
        f"REDIS_TLS_CA_FILE = {str(other.ca)!r}\n"
        f"REDIS_TLS_CERT_FILE = {str(files.client_cert)!r}\n"
        f"REDIS_TLS_KEY_FILE = {str(files.client_key)!r}\n",
    )
    try:
        url = f"rediss://127.0.0.1:{server.port}/0"
        result = scrapy_ha("--redis-url", url, "status", "books", cwd=project)
        # outside a project the CA comes from the URL: the error names how (it named the
        # project's setting alone, which a command outside one has not)
        query = f"ssl_ca_certs={other.ca}&ssl_certfile={files.client_cert}"
        outside = f"{url}?{query}&ssl_keyfile={files.client_key}"
        alone = scrapy_ha("--redis-url", outside, "status", "books", cwd=tmp_path)
    finally:
        server.kill()
    assert result.returncode != 0
    assert f"Redis at {url} presented a certificate this client does not accept" in result.stderr
    assert "the project's REDIS_TLS_CA_FILE" in result.stderr
    assert "Traceback" not in result.stderr
    assert alone.returncode != 0 and "Traceback" not in alone.stderr, alone.stderr
    assert "the URL's ?ssl_ca_certs=" in alone.stderr, alone.stderr


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        # JSON's own message, and "(check REDIS_URL)" after it
        ({"REDIS_PARAMS": "notadict"}, "REDIS_PARAMS='notadict' must be a dict"),
        # "DB index is out of range", and not which Redis (nor, a QA run, which setting)
        (
            {"REDIS_URL": "{base}/99"},
            "Redis at {base}/99 answered ResponseError: DB index is out of range: give a "
            "database it has (CONFIG GET databases: 16 by default, 0 to 15) in REDIS_DB, or "
            "as the path of REDIS_URL",
        ),
        (  # a QA run: read as an IPv6 address, and REDIS_URL blamed
            {"REDIS_URL": "", "REDIS_HOST": "127.0.0.1:6379"},
            "REDIS_HOST='127.0.0.1:6379' holds a port: give the host alone, and the port as "
            "REDIS_PORT (or the whole address as REDIS_URL = 'redis://127.0.0.1:6379')",
        ),
        (  # a review: "Port could not be cast to integer value as '6391:6391'"
            {"REDIS_URL": "", "REDIS_HOST": "[::1]:6391"},
            "REDIS_HOST='[::1]:6391' holds a port: give the host alone",
        ),
        (  # a review: "Invalid IPv6 URL (check REDIS_URL)", and "holds a port" of a URL
            {"REDIS_URL": "", "REDIS_HOST": "redis://127.0.0.1:6391"},
            "REDIS_HOST='redis://127.0.0.1:6391' is a URL: give it as REDIS_URL",
        ),
        # a QA run: tracebacks, and no ha_start_failed
        ({"REDIS_PARAMS": '{{"bogus_kw": 1}}'}, "REDIS_PARAMS (or the query of REDIS_URL): "),
        (  # a review: the cluster's client refuses it as it is made, a traceback
            {"REDIS_URL": "redis+cluster://127.0.0.1:1", "REDIS_PARAMS": '{{"bogus_kw": 1}}'},
            "REDIS_PARAMS (or the query of REDIS_URL): redis-py refused an argument",
        ),
        (
            {"REDIS_PARAMS": '{{"redis_cls": "nonexist.X"}}'},
            "REDIS_PARAMS['redis_cls']='nonexist.X' cannot",
        ),
    ],
)
@deferred_f_from_coro_f
async def test_a_worker_stopped_at_start_by_its_redis_settings_names_them(
    redis_url, site, caplog, settings, said
):
    from tests.test_archive import crawl

    base = redis_url.rsplit("/", 1)[0]
    given = {k: v.format(base=base) for k, v in settings.items()}
    crawler = await crawl(redis_url, site, **given)
    assert crawler.stats.get_value("response_received_count") is None
    assert f"scrapy-ha cannot start: {said.format(base=base)}" in caplog.text, caplog.text
    assert "check REDIS_URL" not in caplog.text
