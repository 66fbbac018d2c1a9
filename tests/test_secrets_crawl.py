"""No secret leaves a worker: a real ``scrapy runspider`` worker given every kind of secret,
then every Redis key, log line, stat, CLI command, dashboard page and API answer, archive
row, metrics scrape and webhook body searched. Only what a worker needs to redo a request
stays, and only in Redis (the request's payload, the cookie jar)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.request import urlopen

import pytest
import redis
from scrapy.settings import default_settings
from w3lib.http import basic_auth_header

from scrapy_ha.deadletters.archive import Archive
from scrapy_ha.dlq import DeadLetterQueue
from scrapy_ha.keys import Keys
from tests.reveal import readable
from tests.secrets_spider import KEPT, SECRETS
from tests.test_cli import SCRAPY_HA, scrapy_ha

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parent.parent
KEYS = Keys("ha", "secrets")
S = SECRETS
#: The Authorization headers HttpAuthMiddleware builds: never stored, never shown.
BUILT = {
    "meta_auth_header": basic_auth_header("alice", S["meta_http_pass"]).decode(),
    "settings_auth_header": basic_auth_header("settings-user", S["httpauth_settings"]).decode(),
}
#: Where a kept secret may be: the stored requests and the cookie jars, in Redis.
ALLOWED = {f"redis {KEYS.payload}", f"redis {KEYS.cookies}"}
#: Seconds the worker has to dead-letter its requests on a loaded machine.
PROGRESS_TIMEOUT = 120


def leaks(places: dict[str, str]) -> dict[str, list[str]]:
    """Secret name -> the places that show it, leaving out where it may be kept."""
    wanted = {**S, **BUILT}
    found: dict[str, list[str]] = {}
    for place, text in places.items():
        shown = readable(text)
        for name, secret in wanted.items():
            if secret in shown and not (name in KEPT and place in ALLOWED):
                found.setdefault(name, []).append(place)
    return found


class Receiver:
    """A webhook receiver on loopback: records every request's body and credentials."""

    def __init__(self) -> None:
        self.bodies: list[str] = []
        self.credentials: list[str | None] = []
        bodies, credentials = self.bodies, self.credentials

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers["Content-Length"])
                credentials.append(self.headers.get("Authorization"))
                bodies.append(self.rfile.read(length).decode())
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        port = self.server.server_address[1]
        self.url = (
            f"http://hook:{S['webhook_password']}@127.0.0.1:{port}/hook/"
            f"{S['webhook_path_token']}?token={S['webhook_query_token']}"
        )
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def secret_redis_url(redis_url: str, redis_client: redis.Redis) -> Iterator[str]:
    """The test's Redis through an ACL user with a password."""
    user = "secrets-user"
    password = S["redis_password"]
    redis_client.execute_command("ACL", "SETUSER", user, "on", f">{password}", "~*", "&*", "+@all")
    yield redis_url.replace("redis://", f"redis://{user}:{password}@")
    redis_client.execute_command("ACL", "DELUSER", user)


def start_worker(url: str, site: Any, proxy: Any, tmp: Path, **extra: str) -> subprocess.Popen:
    settings = {
        "REDIS_URL": url,
        "HTTPAUTH_PASS": S["httpauth_settings"],
        "HTTPAUTH_DOMAIN": site.url.split("://", 1)[1],  # compared with host:port
        "HA_PROXY_MODE": "tunnel",
        "HA_PROXY_URL": f"http://bob:{S['proxy_password']}@127.0.0.1:{proxy.port}",
        "HA_DLQ_ALERT_THRESHOLD": "1",
        "HA_RETRY_JITTER": "0",
        "HA_RETRY_POLICIES": json.dumps({"server": {"base": 600}}),  # the 500 waits, delayed
        "SECRETS_STATS_FILE": str(tmp / "stats.json"),
        "LOG_LEVEL": "DEBUG",
        "DOWNLOAD_TIMEOUT": "10",
        **extra,
    }
    args = [sys.executable, "-m", "scrapy.cmdline", "runspider"]
    args += [str(ROOT / "tests" / "secrets_spider.py"), "-a", f"base_url={site.url}"]
    for name, value in settings.items():
        args += ["-s", f"{name}={value}"]
    with (tmp / "worker.log").open("wb") as out:
        return subprocess.Popen(args, cwd=tmp, env=_env(), stdout=out, stderr=subprocess.STDOUT)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def wait_until(done: Any, what: str, proc: subprocess.Popen, log: Path) -> None:
    """Wait while the worker makes progress (or fail with its log)."""
    deadline = time.monotonic() + PROGRESS_TIMEOUT
    while not done():
        assert proc.poll() is None, f"the worker ended early:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} after {PROGRESS_TIMEOUT} s"
        time.sleep(0.1)


def every_key(client: redis.Redis) -> dict[str, str]:
    """Every key of the database, read by its type: place -> its content as text."""
    out = {}
    for key in client.scan_iter(count=1000):
        kind = client.type(key).decode()
        if kind == "string":
            value: Any = client.get(key)
        elif kind == "hash":
            value = client.hgetall(key)
        elif kind == "list":
            value = client.lrange(key, 0, -1)
        elif kind == "set":
            value = client.smembers(key)
        elif kind == "zset":
            value = client.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            value = client.xrange(key)
        else:
            value = client.dump(key)
        out[f"redis {key.decode()}"] = _text(value)
    return out


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if isinstance(value, dict):
        return "\n".join(f"{_text(k)} {_text(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple, set)):
        return "\n".join(_text(v) for v in value)
    return str(value)


def cli_outputs(url: str, ids: list[str], archive: str) -> dict[str, str]:
    """The output (stdout and stderr) of every `scrapy-ha` command that reads the crawl, and
    of the dry runs of those that change it."""
    commands = [
        ["status", "secrets"],
        ["status", "secrets", "--json"],
        ["workers", "secrets"],
        ["workers", "secrets", "--json"],
        ["report", "secrets"],
        ["report", "secrets", "--format", "json"],
        ["report", "secrets", "--format", "markdown"],
        ["dlq", "list", "secrets"],
        ["dlq", "export", "secrets"],
        *[["dlq", "show", "secrets", i] for i in ids],
        ["dlq", "archive", "secrets", "--url", archive, "--dry-run"],
        ["dlq", "requeue", "secrets", "--all", "--dry-run"],
        ["dlq", "purge", "secrets", "--all", "--dry-run"],
        ["delayed", "list", "secrets"],
        ["delayed", "retry-now", "secrets", "--all", "--dry-run"],
        ["checkpoints", "list", "secrets"],
    ]
    out = {}
    for args in commands:
        result = scrapy_ha("--redis-url", url, *args)
        assert result.returncode == 0, (args, result.stderr)
        out[f"cli {' '.join(args)}"] = result.stdout + result.stderr
    # an error names the Redis URL: with its password masked
    away = re.sub(r"@127\.0\.0\.1:\d+", "@127.0.0.1:1", url)
    result = scrapy_ha("--redis-url", away, "status", "secrets")
    assert result.returncode == 2 and "127.0.0.1:1" in result.stderr, result.stderr
    out["cli status (Redis away)"] = result.stdout + result.stderr
    return out


def metrics_output(url: str) -> str:
    """`scrapy-ha metrics`: its start line and one scrape."""
    proc = subprocess.Popen(
        [SCRAPY_HA, "--redis-url", url, "metrics", "--port", "0", "--addr", "127.0.0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        port = int(re.search(r"127\.0\.0\.1:(\d+)/metrics", first)[1])  # type: ignore[index]
        with urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
            scraped = r.read().decode()
    finally:
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
    return first + scraped + rest


def dashboard_outputs(url: str, dead: list[str], delayed: list[str]) -> dict[str, str]:
    """Every page and /api/ answer of the dashboard about the crawl."""
    from fastapi.testclient import TestClient

    from scrapy_ha.dashboard.app import create_app

    client = redis.asyncio.Redis.from_url(url)
    app = create_app(client, "ha", close_client=True)
    base = ["", "/crawls/secrets", "/crawls/secrets/dead", "/crawls/secrets/delayed"]
    base += [f"/crawls/secrets/dead/{i}" for i in dead]
    base += [f"/crawls/secrets/delayed/{i}" for i in delayed]
    paths = ["/", *base[1:], "/api/crawls", *(f"/api{p}" for p in base[1:])]
    out = {}
    with TestClient(app, base_url="http://127.0.0.1", follow_redirects=False) as http:
        for path in paths:
            answer = http.get(path)
            assert answer.status_code == 200, (path, answer.text)
            out[f"dashboard {path}"] = answer.text
    return out


@contextmanager
def pg_archive(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """The suite's PostgreSQL as an archive URL with a password in its user info and in its
    query string (trust authentication ignores both), or None without PostgreSQL."""
    try:
        url: str = request.getfixturevalue("postgres_url")
    except pytest.skip.Exception:
        yield None
        return
    yield url.replace("postgres@", f"postgres:{S['archive_password']}@") + (
        f"?password={S['archive_query_password']}"
    )


def archive_tables(urls: list[str]) -> dict[str, str]:
    out = {}
    for url in urls:
        archive = Archive(url)
        try:
            rows = archive.rows()
        finally:
            archive.close()
        assert rows, f"nothing archived in {url.split(':')[0]}"
        out[f"archive {url.split(':')[0]}"] = json.dumps(rows, default=str)
    return out


@pytest.mark.filterwarnings("ignore:Query string argument")  # SQLite takes no ?password=
def archived(client: Any) -> list[bytes]:
    """The dead letters an archive holds (the hash's other fields, ``~archive`` and
    ``~sink:<id>``, name the archives)."""
    return [f for f in client.hkeys(KEYS.dead_archived) if not f.startswith(b"~")]


# the planted SQLite URL carries ?password= on purpose: SQLAlchemy warns that it ignores it
@pytest.mark.filterwarnings("ignore:Query string argument.*pysqlite:sqlalchemy.exc.SAWarning")
# a crawl, 23 CLI runs, a scrape and every dashboard page: minutes on a busy machine
@pytest.mark.timeout(900)
def test_no_secret_leaves_a_worker(
    secret_redis_url, redis_client, site, proxy_factory, receiver, tmp_path, request
):
    proxy = proxy_factory("--user", "bob", "--password", S["proxy_password"])
    sqlite = f"sqlite:///{tmp_path / 'failed.db'}?password={S['archive_query_password']}"
    worker = start_worker(
        secret_redis_url,
        site,
        proxy,
        tmp_path,
        HA_DLQ_ARCHIVE_URL=sqlite,
        HA_DLQ_ALERT_WEBHOOK=receiver.url,
    )
    log = tmp_path / "worker.log"
    try:
        # six requests dead, one delayed, all archived, the alert received: then stop it
        wait_until(lambda: redis_client.zcard(KEYS.dead) == 6, "6 dead letters", worker, log)
        wait_until(lambda: redis_client.zcard(KEYS.delayed) == 1, "delayed retry", worker, log)
        wait_until(lambda: len(archived(redis_client)) == 6, "archive", worker, log)
        wait_until(lambda: receiver.bodies, "webhook alert", worker, log)
    finally:
        worker.send_signal(signal.SIGINT)
        worker.wait(timeout=60)
    dead = [m.decode() for m in redis_client.zrange(KEYS.dead, 0, -1)]
    delayed = [m.decode() for m in redis_client.zrange(KEYS.delayed, 0, -1)]

    places = every_key(redis_client)
    places["log worker"] = log.read_text()
    places["stats"] = (tmp_path / "stats.json").read_text()
    places.update(cli_outputs(secret_redis_url, dead, sqlite))
    places["metrics"] = metrics_output(secret_redis_url)
    places.update(dashboard_outputs(secret_redis_url, dead, delayed))
    places["webhook bodies"] = "\n".join(receiver.bodies)
    archives = [sqlite]
    with pg_archive(request) as pg:
        if pg is not None:
            _archive_to(secret_redis_url, pg)
            archives.append(pg)
            result = scrapy_ha(
                "--redis-url", secret_redis_url, "dlq", "archive", "secrets", "--url", pg
            )
            places["cli dlq archive (PostgreSQL)"] = result.stdout + result.stderr
        places.update(archive_tables(archives))

    assert not leaks(places), leaks(places)
    # the search can fail: the kept secrets are there, where a worker redoing a request reads
    stored = readable(places[f"redis {KEYS.payload}"])
    assert all(S[name] in stored for name in KEPT - {"cookie_jar"}), "the payloads lost a secret"
    assert S["cookie_jar"] in readable(places[f"redis {KEYS.cookies}"])
    # the webhook's user info went as Basic authentication, not in the bodies
    assert receiver.credentials[0] == basic_auth_header("hook", S["webhook_password"]).decode()
    assert "Overridden settings" in places["log worker"]  # the settings were logged, masked
    # (Scrapy lists the settings of its defaults only: 2.16 has no HTTPAUTH_PASS there)
    if hasattr(default_settings, "HTTPAUTH_PASS"):
        assert "HTTPAUTH_PASS" in places["log worker"] and "***" in places["log worker"]


def _archive_to(url: str, archive_url: str) -> None:
    """Write every dead letter into the archive at *archive_url* (the rows the CLI writes;
    in a thread: this one's event loop is the reactor's)."""

    async def copy() -> None:
        async with DeadLetterQueue.from_url(url, "secrets") as dlq:
            entries = await dlq.entries()
        archive = Archive(archive_url)
        try:
            archive.create()
            archive.write("secrets", entries)
        finally:
            archive.close()

    with ThreadPoolExecutor(1) as thread:
        thread.submit(asyncio.run, copy()).result()
