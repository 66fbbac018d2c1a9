"""Fixtures: a real redis-server and the demo site, each in a subprocess on a free port."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A redis-server of our own: ``start``, ``stop`` (graceful or SIGKILL), ``url``."""

    def __init__(self, directory: Path, port: int | None = None, appendonly: bool = False):
        self.dir = directory
        self.port = port or free_port()
        self.appendonly = appendonly
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not Path(binary).exists():
            pytest.fail("redis-server is not installed: run `make test` (it installs it)")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes" if self.appendonly else "no", "--dir", str(self.dir),
             "--maxmemory-policy", "noeviction", "--logfile", str(self.dir / "redis.log")],
        )  # fmt: skip
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        for _ in range(100):
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        pytest.fail(f"redis-server did not start on port {self.port}")

    def stop(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        self.proc.wait(10)
        self.proc = None


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """The URL of a flushed Redis database."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    yield redis_server.url
    client.close()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


class Site:
    """The demo catalogue (or, with module=..., the demo proxy) in a subprocess."""

    module = "scrapy_ha.demo.site"

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", self.module, *args],
                                     stdout=subprocess.PIPE)  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        if not line.startswith("LISTENING"):
            self.stop()
            pytest.fail(f"{self.module} did not start: {line!r}")
        self.port = int(line.split()[1])
        scheme = "https" if "--tls" in args else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"

    def log(self) -> list[list]:
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
        self.proc.terminate()
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def site_factory() -> Iterator[type[Site]]:
    started: list[Site] = []

    class _Factory(Site):
        def __init__(self, *args: str) -> None:
            super().__init__(*args)
            started.append(self)

    yield _Factory
    for site in started:
        site.stop()


@pytest.fixture
def proxy_factory(site_factory: type[Site]) -> type[Site]:
    """Starts the demo forward proxy (stopped with the sites)."""

    class _Proxy(site_factory):  # type: ignore[misc, valid-type]
        module = "scrapy_ha.demo.proxy"

    return _Proxy


@pytest.fixture
def site(site_factory: type[Site]) -> Site:
    """A small catalogue: 5 list pages of 10 items."""
    return site_factory("--pages", "5", "--per-page", "10")
