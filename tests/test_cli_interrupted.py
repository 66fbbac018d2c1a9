"""Ctrl-C stops a command with a line, not a traceback: a command waiting on a Redis that
took its connection and does not answer is interrupted (exit code 130, as a shell gives a
program SIGINT stopped)."""

from __future__ import annotations

import signal
import socket
import subprocess

from tests.test_cli import SCRAPY_HA


def test_ctrl_c_stops_a_command_with_a_line_not_a_traceback() -> None:
    """A QA run: Ctrl-C on any command (only ``watch``, ``items`` and ``metrics`` handle
    it) printed Python's KeyboardInterrupt traceback."""
    with socket.create_server(("127.0.0.1", 0)) as server:  # takes connections, answers none
        port = server.getsockname()[1]
        proc = subprocess.Popen(
            [SCRAPY_HA, "--redis-url", f"redis://:s3cret@127.0.0.1:{port}/0", "status", "x"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            server.settimeout(60)
            conn, _ = server.accept()  # the command is waiting for Redis's answer now
            with conn:
                proc.send_signal(signal.SIGINT)
                out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == 130, (proc.returncode, err)
    assert "Traceback" not in err, err
    assert err.strip() == "interrupted", err
    assert "s3cret" not in out + err


def test_a_command_started_with_sigint_ignored_keeps_ignoring_it() -> None:
    """A shell starts a script's background job with SIGINT ignored (so that a Ctrl-C in
    the terminal stops the script, not its background work), and Python and asyncio keep
    it ignored. The command line's own handler took its place: the Ctrl-C meant for the
    script stopped the command (exit code 130). It runs on, here to its connection's
    timeout (exit code 2)."""
    with socket.create_server(("127.0.0.1", 0)) as server:  # takes connections, answers none
        port = server.getsockname()[1]
        proc = subprocess.Popen(
            [SCRAPY_HA, "--redis-url", f"redis://127.0.0.1:{port}/0", "status", "x"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # noqa: PLW1509
        )
        try:
            server.settimeout(60)
            conn, _ = server.accept()  # the command is waiting for Redis's answer now
            with conn:
                proc.send_signal(signal.SIGINT)
                out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == 2, (proc.returncode, err)  # before: 130, "interrupted"
    assert "cannot reach Redis" in err, err
