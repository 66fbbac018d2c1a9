"""Fixtures: a real redis-server and the demo site, each in a subprocess on a free port."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
from typing import TYPE_CHECKING, Any

import pytest
import redis

from scrapy_ha.demo import harness
from scrapy_ha.demo.harness import free_port
from tests._postgres import (  # noqa: F401 (fixtures)
    archive_url,
    postgres_server,
    postgres_url,
    second_archive_url,
)
from tests.scrapy_conformance.keys import generate_keys

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

__all__ = ["RedisServer", "Site", "free_port"]

# A suite started as a shell's background job (``make test &``, a CI step run so) inherits
# SIGINT ignored, and so would every command and worker it starts, which keep it ignored as
# Python does: the tests that send them SIGINT play a terminal's Ctrl-C to a foreground job.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

#: Databases of the session's redis-server, handed to the tests in turn: whatever a finished
#: test left running in this process (a crawl's background loop after a failed assertion)
#: writes into a database no test uses now, instead of into the next test's keys.
DATABASES = 64
#: Database 0 is left to the clients that name none (RedisServer.url, the CLI's default).
_turns = itertools.count()


class RedisServer:
    """A redis-server of our own: ``start``, ``stop`` (graceful or SIGKILL), ``url``.

    The first ``start`` moves to another free port if the one picked was taken meanwhile
    (unless a port was given); ``start`` after ``stop`` restarts it on the same port, as soon
    as that port is free again."""

    def __init__(self, directory: Path, port: int | None = None, appendonly: bool = False):
        self.dir = directory
        self.port = port or free_port()
        self._fixed_port = port is not None
        self.appendonly = appendonly
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.url_of(0)

    def url_of(self, db: int) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        try:
            self.proc, self.port = harness.start_redis(
                self.dir,
                port=self.port if self._fixed_port else None,
                args=[
                    "--appendonly",
                    "yes" if self.appendonly else "no",
                    "--databases",
                    str(DATABASES),
                ],
            )
        except (FileNotFoundError, RuntimeError) as exc:
            pytest.fail(str(exc))
        self._fixed_port = True  # a restart keeps the URL the clients know

    def stop(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        if kill:
            harness.signal_group(self.proc, signal.SIGKILL)
        harness.stop(self.proc)
        self.proc = None


@pytest.fixture(autouse=True)
def _stop_leftover_processes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every process a test started and left running is stopped when the test ends, with
    its process group, pass or fail (a failed assertion must not leave workers crawling)."""
    started: list[subprocess.Popen[bytes]] = []
    original: Callable[..., None] = subprocess.Popen.__init__

    def record(self: subprocess.Popen[bytes], *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)
        started.append(self)

    monkeypatch.setattr(subprocess.Popen, "__init__", record)
    yield
    monkeypatch.undo()
    for proc in started:
        if proc.returncode is None:
            harness.stop(proc)


@pytest.fixture(autouse=True)
def _thaw_after_the_test() -> Iterator[None]:
    """A crawl's close leaves its frozen heap to a thaw a few seconds later
    (scrapy_ha.scheduler.session.heap): done when the test ends, so that no freeze of one
    test is found by the next one."""
    yield
    from scrapy_ha.scheduler.session.heap import thaw_pending  # noqa: PLC0415

    thaw_pending()


@pytest.fixture
def fast_engine_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scrapy's engine asks the scheduler for requests every 0.2 s instead of 5 s when idle:
    a crawl's test waits for it less (a test file asks for it with ``pytestmark``)."""
    from scrapy.core.engine import ExecutionEngine

    monkeypatch.setattr(ExecutionEngine, "_SLOT_HEARTBEAT_INTERVAL", 0.2)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """The URL of a flushed Redis database of its own (the next one of the session's server)."""
    url = redis_server.url_of(1 + next(_turns) % (DATABASES - 1))
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.close()


@pytest.fixture
def redis_writes(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every write of a command or of a pipeline (one write: one round trip) by redis-py's
    own asyncio connections (not the worker's, whose classes write their own way)."""
    from redis.asyncio.connection import Connection

    sent: list[Any] = []
    own = Connection.send_packed_command

    async def counted(self: Connection, command: Any, check_health: bool = True) -> None:
        sent.append(command)
        await own(self, command, check_health)

    monkeypatch.setattr(Connection, "send_packed_command", counted)
    return sent


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


class Site:
    """The demo catalogue (or, with module=..., the demo proxy) in a subprocess."""

    module = harness.SITE_MODULE

    def __init__(self, *args: str) -> None:
        try:
            self.proc, self.port = harness.start_module(self.module, *args)
        except RuntimeError as exc:
            pytest.fail(str(exc))
        scheme = "https" if "--tls" in args else "http"
        host = args[args.index("--interface") + 1] if "--interface" in args else "127.0.0.1"
        self.url = f"{scheme}://{host}:{self.port}"

    def log(self) -> list[list[Any]]:
        import json
        import ssl
        from urllib.request import urlopen

        with urlopen(self.url + "/_log", context=ssl._create_unverified_context()) as r:
            return list(json.load(r))

    def hits(self) -> dict[str, int]:
        import json
        import ssl
        from urllib.request import urlopen

        with urlopen(self.url + "/_hits", context=ssl._create_unverified_context()) as r:
            return dict(json.load(r))

    def stop(self) -> None:
        harness.stop(self.proc)


@pytest.fixture
def site_factory() -> Iterator[type[Site]]:
    started: list[Site] = []

    class _Factory(Site):
        def __init__(self, *args: str) -> None:
            super().__init__(*args)
            started.append(self)

    try:
        yield _Factory
    finally:
        for site in started:
            site.stop()


@pytest.fixture
def proxy_factory(site_factory: type[Site]) -> type[Site]:
    """Starts the demo forward proxy (stopped with the sites)."""

    class _Proxy(site_factory):  # type: ignore[misc, valid-type]
        module = harness.PROXY_MODULE

    return _Proxy


@pytest.fixture
def site(site_factory: type[Site]) -> Site:
    """A small catalogue: 5 list pages of 10 items."""
    return site_factory("--pages", "5", "--per-page", "10")


def pytest_configure(config: pytest.Config) -> None:
    """The conformance suite's mock server certificate (as Scrapy's conftest makes it), once
    per run, here: this conftest is loaded by pytest-xdist's controller before it starts its
    workers (the suite's own conftest is loaded by each worker, and a worker that wrote the
    pair while another's mock server read it gave that server a key of one pair and the
    certificate of the other: "key values mismatch", the HTTPS tests failed)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        generate_keys()
