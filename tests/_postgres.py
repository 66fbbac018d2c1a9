"""A PostgreSQL server of the test session's own (Debian's postgresql package), on a free port.

initdb refuses to run as root; the suite runs as root in CI, so the server then runs as the
``postgres`` user the package creates, in a directory of its own under /tmp (pytest's temp
directories are closed to other users).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pytest

from scrapy_ha.demo.harness import free_port, wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

__all__ = ["PostgresServer", "archive_url", "new_database", "postgres_url", "second_archive_url"]

#: Where Debian puts the server's binaries (one directory per major version).
BINARIES = "/usr/lib/postgresql/*/bin"
#: Seconds the server has to start on a loaded machine.
START_TIMEOUT = 60.0


def _bin_dir() -> str | None:
    found = sorted(glob.glob(BINARIES), key=lambda p: int(p.split("/")[-2]))
    return found[-1] if found else None


class PostgresServer:
    """initdb + postgres on 127.0.0.1:<free port>, trust authentication, user ``postgres``."""

    def __init__(self, bin_dir: str) -> None:
        self.bin = bin_dir
        self.dir = tempfile.mkdtemp(prefix="scrapy-ha-pg-")
        self.port = free_port()
        self.data = os.path.join(self.dir, "data")
        self.log = os.path.join(self.dir, "postgres.log")
        self.started = False
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(self.dir, "postgres", "postgres")

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        subprocess.run(
            [*self._as, f"{self.bin}/initdb", "-D", self.data, "-U", "postgres", "--auth=trust"],
            check=True,
            capture_output=True,
        )
        # pg_ctl starts the server in the background and returns: the server is no process
        # of the test that asked for it first (conftest stops those when the test ends)
        options = f"-p {self.port} -h 127.0.0.1 -k {self.dir} -c fsync=off"
        subprocess.run(
            [*self._as, f"{self.bin}/pg_ctl", "-D", self.data, "-o", options, "-l", self.log]
            + ["-w", "-t", str(int(START_TIMEOUT)), "start"],
            check=True,
            capture_output=True,
        )
        self.started = True
        wait_for(self._ready, f"PostgreSQL on port {self.port}", START_TIMEOUT, interval=0.2)

    def _ready(self) -> bool:
        probe = subprocess.run(
            [f"{self.bin}/pg_isready", "-h", "127.0.0.1", "-p", str(self.port)],
            capture_output=True,
        )
        return probe.returncode == 0

    def stop(self) -> None:
        if self.started:
            subprocess.run(
                [*self._as, f"{self.bin}/pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop"],
                capture_output=True,
            )
            self.started = False
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bin_dir = _bin_dir()
    if bin_dir is None:
        pytest.skip(
            f"PostgreSQL is not installed (no {BINARIES}): apt-get install postgresql "
            f"(the Makefile's DEBIAN_PACKAGES)"
        )
    server = PostgresServer(bin_dir)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@contextmanager
def new_database(server: PostgresServer) -> Iterator[str]:
    """A fresh database of *server*, dropped afterwards: its URL."""
    import sqlalchemy

    name = f"t{free_port()}"
    admin = sqlalchemy.create_engine(server.url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
    try:
        yield server.url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(sqlalchemy.text(f"DROP DATABASE {name} WITH (FORCE)"))
        admin.dispose()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh database of the session's server for each test."""
    with new_database(postgres_server) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def archive_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An archive database URL: a SQLite file, then the suite's PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'failed.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def second_archive_url(
    archive_url: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[str]:
    """Another database of *archive_url*'s kind: another SQLite file, or another
    database of the suite's PostgreSQL."""
    if archive_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path / 'second.db'}"
        return
    with new_database(request.getfixturevalue("postgres_server")) as url:
        yield url
