"""Processes for the demo, the tests, the chaos suite and the benchmark: one way to pick a
port, start a redis-server, start the demo site or proxy (or any server that prints a ready
line), wait for something with a deadline, and stop a process with everything it started.

Every process is started in its own session (``start_new_session=True``), so that stopping
it signals its whole process group: a scrapyd job, a worker's children, a demo's Redis.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

#: Seconds a stopped process gets to exit after SIGTERM before its group is SIGKILLed.
STOP_GRACE = 10.0
#: Attempts at starting a redis-server on a fresh port: another process may take the port
#: between the moment it is picked and the moment Redis binds it.
REDIS_START_TRIES = 5
#: Seconds a redis-server gets to answer PING (an AOF replay under load takes a while).
REDIS_START_TIMEOUT = 30.0
#: Seconds a server gets to print its ``LISTENING`` line (a Python start-up under load on a
#: shared 2-core machine takes a few seconds; a server that never prints must not hang us).
READY_TIMEOUT = 60.0
#: The demo catalogue site and the demo forward proxy, as ``python -m`` modules.
SITE_MODULE = "scrapy_ha.demo.site"
PROXY_MODULE = "scrapy_ha.demo.proxy"


class Timeout(RuntimeError):
    """A wait passed its deadline."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for servers that cannot be handed a socket)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Callable[[], Any], what: str, timeout: float, interval: float = 0.05) -> Any:
    """Poll *check* until it returns something true; raise `Timeout` naming *what* after
    *timeout* seconds. For processes that run no reactor (tests, CLIs): sleeping is fine."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise Timeout(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def spawn(args: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """`subprocess.Popen` in a session of its own, so `stop` reaches its children too."""
    return subprocess.Popen(list(args), start_new_session=True, **kwargs)


def signal_group(proc: subprocess.Popen[Any], sig: int) -> None:
    """Send *sig* to the process group *proc* leads (to *proc* alone if it leads none;
    a no-op once it is gone)."""
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, sig)
        elif proc.poll() is None:
            proc.send_signal(sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(proc: subprocess.Popen[Any] | None, grace: float = STOP_GRACE) -> None:
    """SIGTERM the group of *proc* (SIGCONT first: it may be frozen), SIGKILL it after
    *grace* seconds, and reap *proc*. Safe to call twice, and on processes that ended."""
    if proc is None:
        return
    for sig in (signal.SIGCONT, signal.SIGTERM):
        signal_group(proc, sig)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    signal_group(proc, signal.SIGKILL)  # children that outlive their parent, too
    proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def redis_ping(port: int) -> bool:
    """Whether a redis-server on *port* answers PING (not while it loads its AOF)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _ended_or_answers(proc: subprocess.Popen[bytes], port: int) -> bool:
    """A starting redis-server has either given up (its port was taken) or answers PING."""
    return proc.poll() is not None or redis_ping(port)


def redis_binary() -> str:
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not Path(binary).exists():
        raise FileNotFoundError("redis-server is not installed: run `make deps` (it installs it)")
    return binary


def start_redis(
    directory: Path,
    *,
    port: int | None = None,
    args: Sequence[str] = (),
    timeout: float = REDIS_START_TIMEOUT,
) -> tuple[subprocess.Popen[bytes], int]:
    """Start a redis-server with its data and log in *directory*; return it and its port.

    Without *port*, a free one is picked, and another one if that was taken in between.
    With *port* (a restart on the same port), it waits until the port is free again.
    """
    directory.mkdir(parents=True, exist_ok=True)
    for _ in range(REDIS_START_TRIES):
        chosen = port or free_port()
        proc = spawn(
            [
                redis_binary(),
                "--port",
                str(chosen),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(directory),
                "--save",
                "",
                "--maxmemory-policy",
                "noeviction",
                "--logfile",
                str(directory / "redis.log"),
                *args,
            ]
        )
        try:
            wait_for(
                partial(_ended_or_answers, proc, chosen), f"redis-server on port {chosen}", timeout
            )
        except Timeout:
            stop(proc)
            raise
        if proc.poll() is None:
            return proc, chosen
        proc.wait()
        if port is not None:  # the old server's port is not free yet: try again shortly
            time.sleep(0.2)
    raise RuntimeError(f"redis-server did not start in {directory} (see redis.log there)")


def read_listening(
    proc: subprocess.Popen[bytes], what: str, timeout: float = READY_TIMEOUT
) -> list[int]:
    """The ports of a server that prints ``LISTENING PORT...`` as its first line, read within
    *timeout* seconds; the server is stopped if it prints anything else, ends, or stays silent."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        ready = selector.select(timeout)
    # the line is short and written in one go: once readable, readline returns it whole
    line = proc.stdout.readline().decode(errors="replace") if ready else ""
    if not line.startswith("LISTENING"):
        stop(proc)
        said = repr(line) if ready else f"no ready line within {timeout:g} s"
        raise RuntimeError(f"{what} did not start: {said}")
    return [int(x) for x in line.split()[1:]]


def start_listening(
    args: Sequence[str], *, timeout: float = READY_TIMEOUT, **kwargs: Any
) -> tuple[subprocess.Popen[bytes], list[int]]:
    """Start a server that binds its own ports and prints ``LISTENING PORT...`` once it
    accepts connections (no port is picked before it binds, so none can be taken meanwhile);
    return it and its ports. *kwargs* go to `spawn` (``cwd``, ``env``, ``stderr``)."""
    proc = spawn(args, stdout=subprocess.PIPE, **kwargs)
    what = next((a for a in args[1:] if not a.startswith("-")), args[0])
    return proc, read_listening(proc, what, timeout)


def start_module(module: str, *args: str, **kwargs: Any) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``python -m module *args`` (the demo site, the demo proxy) with this interpreter;
    return it and the one port it listens on."""
    proc, ports = start_listening([sys.executable, "-m", module, *args], **kwargs)
    return proc, ports[0]


def start_site(*args: str, **kwargs: Any) -> tuple[subprocess.Popen[bytes], str]:
    """Start the demo catalogue site with *args* (``--pages``, ``--fault``, ``--tls``...);
    return it and its base URL."""
    proc, port = start_module(SITE_MODULE, *args, **kwargs)
    scheme = "https" if "--tls" in args else "http"
    return proc, f"{scheme}://127.0.0.1:{port}"


def start_proxy(*args: str, **kwargs: Any) -> tuple[subprocess.Popen[bytes], int]:
    """Start the demo forward proxy with *args* (``--user``, ``--password``, ``--exits``);
    return it and its port."""
    return start_module(PROXY_MODULE, *args, **kwargs)


@contextmanager
def work_dir(prefix: str, given: Path | None = None) -> Iterator[Path]:
    """A directory for a run's files (Redis's, the workers' logs): *given* (created, and
    kept), else a new temporary one, removed when the run ends, and kept when it fails,
    with a line on stderr saying where."""
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        yield given
        return
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    except BaseException:
        print(f"the run's files are kept in {path}", file=sys.stderr)
        raise
    shutil.rmtree(path, ignore_errors=True)
