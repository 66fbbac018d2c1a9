"""Ctrl-C stops a command with a line, not a traceback: a command waiting on a Redis that
took its connection and does not answer is interrupted (exit code 130, as a shell gives a
program SIGINT stopped)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from typing import TYPE_CHECKING, Any

from scrapy_ha.demo.harness import wait_for
from tests.scrapy_project import write_project
from tests.test_cli import SCRAPY_HA

if TYPE_CHECKING:
    from pathlib import Path


def ctrl_c_while_waiting(password: str = "", **popen: Any) -> tuple[int, str, str]:
    """``scrapy-ha status`` against a Redis that takes its connection and answers nothing,
    sent SIGINT once it waits for the answer: (exit code, stdout, stderr)."""
    with socket.create_server(("127.0.0.1", 0)) as server:  # takes connections, answers none
        port = server.getsockname()[1]
        auth = f":{password}@" if password else ""
        url = f"redis://{auth}127.0.0.1:{port}/0"
        proc = subprocess.Popen(
            [SCRAPY_HA, "--redis-url", url, "status", "x"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **popen,
        )
        try:
            server.settimeout(60)
            conn, _ = server.accept()  # the command is waiting for Redis's answer now
            with conn:
                proc.send_signal(signal.SIGINT)
                out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
    return proc.returncode, out, err


def test_ctrl_c_stops_a_command_with_a_line_not_a_traceback() -> None:
    """A QA run: Ctrl-C on any command (only ``watch``, ``items`` and ``metrics`` handle
    it) printed Python's KeyboardInterrupt traceback."""
    code, out, err = ctrl_c_while_waiting("s3cret")
    assert code == 130, (code, err)
    assert "Traceback" not in err, err
    assert err.strip() == "interrupted", err
    assert "s3cret" not in out + err


def test_a_command_started_with_sigint_ignored_keeps_ignoring_it() -> None:
    """A shell starts a script's background job with SIGINT ignored (so that a Ctrl-C in
    the terminal stops the script, not its background work), and Python and asyncio keep
    it ignored. The command line's own handler took its place: the Ctrl-C meant for the
    script stopped the command (exit code 130). It runs on, here to its connection's
    timeout (exit code 2)."""
    ignored = {"preexec_fn": lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)}
    code, _, err = ctrl_c_while_waiting(**ignored)
    assert code == 2, (code, err)  # before: 130, "interrupted"
    assert "cannot reach Redis" in err, err


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) the process *pid* has used so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_ctrl_c_while_the_command_line_is_read_stops_with_a_line() -> None:
    """A QA run: Ctrl-C in a command's first moments (its line being parsed, a fraction
    of a second, longer on a loaded machine or for a line of thousands of `--id`) printed
    Python's KeyboardInterrupt traceback, the process killed by the signal: the command
    line's own handler was put in place only after the line was read."""
    ids = [arg for _ in range(20_000) for arg in ("--id", "1-0")]
    proc = subprocess.Popen(
        [SCRAPY_HA, "items", "s", "--to", "jsonl:/nonexistent/x.jl", "--retry-aside", *ids],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # argparse takes seconds of CPU over such a line: once the process has used half a
        # second (its start takes a tenth), it is reading the line
        wait_for(lambda: cpu_seconds(proc.pid) >= 0.5, "the command line being read", 60, 0.02)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, (proc.returncode, err[-500:])
    assert err.strip() == "interrupted", err[-500:]


#: A spider module that, as it is imported, catches the KeyboardInterrupt of a Ctrl-C, as
#: lxml's initialisation does when the signal lands in it (Scrapy imports lxml at start)
SWALLOWING_SPIDERS = """
import os
import signal

import scrapy

try:
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, while this module is imported
except BaseException:
    pass


class S(scrapy.Spider):
    name = "s"
"""


def test_a_ctrl_c_a_library_swallowed_while_the_consumer_started_stops_it(
    tmp_path: Path, redis_url: str
) -> None:
    """A QA run: Ctrl-C on `scrapy-ha items` as it started, while Scrapy imported lxml,
    was swallowed by lxml's initialisation, and the consumer ran on, consuming, as if no
    Ctrl-C had been pressed (once in 60 tries on a loaded machine)."""
    project = write_project(
        tmp_path / "project", "swallow", SWALLOWING_SPIDERS, settings='HA_ITEMS = "outbox"\n'
    )
    command = [SCRAPY_HA, "items", "s", "--to", f"jsonl:{tmp_path / 'x.jl'}", "--create"]
    proc = subprocess.Popen(
        [*command, "--redis-url", redis_url],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the consumer ran on after Ctrl-C: {err[-500:]}") from None
    assert proc.returncode == 130, (proc.returncode, err[-500:])
    assert err.strip().splitlines()[-1] == "interrupted", err[-500:]
