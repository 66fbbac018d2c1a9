"""The process harness the tests, the demo, chaos and bench share: ready lines read within a
deadline, servers that fail to start stopped and named, Redis started on a free port."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING
from urllib.request import urlopen

import pytest

from scrapy_ha.demo import harness

if TYPE_CHECKING:
    from pathlib import Path

#: A deadline short enough for a test, long enough for a Python start-up under load.
READY = 20.0


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_start_site_serves_the_catalogue_at_the_url_it_returns() -> None:
    proc, url = harness.start_site("--pages", "1", "--per-page", "3", timeout=60)
    try:
        with urlopen(url + "/list/1") as response:
            body = response.read().decode()
        assert body.count('class="item"') == 3, body
    finally:
        harness.stop(proc)
    assert proc.returncode is not None


def test_a_server_silent_past_the_deadline_is_stopped_and_named() -> None:
    with pytest.raises(RuntimeError, match=r"did not start: no ready line within 1 s"):
        harness.start_listening(python("import time; time.sleep(60)"), timeout=1)


def test_a_server_that_says_something_else_is_stopped_and_quoted() -> None:
    with pytest.raises(RuntimeError, match=r"did not start: 'Traceback: boom\\n'"):
        harness.start_listening(
            python("import sys, time; print('Traceback: boom', flush=True); time.sleep(60)"),
            timeout=READY,
        )


def test_a_server_that_ends_before_its_ready_line_is_reported() -> None:
    with pytest.raises(RuntimeError, match=r"did not start: ''"):
        harness.start_listening(python("pass"), timeout=READY)


def test_start_listening_returns_every_port_of_the_ready_line() -> None:
    proc, ports = harness.start_listening(
        python("import time; print('LISTENING 1234 5678', flush=True); time.sleep(60)"),
        timeout=READY,
    )
    try:
        assert ports == [1234, 5678]
    finally:
        harness.stop(proc)


def test_redis_restarts_on_the_port_its_clients_know(tmp_path: Path) -> None:
    proc, port = harness.start_redis(tmp_path)
    try:
        assert harness.redis_ping(port)
        harness.stop(proc)
        assert not harness.redis_ping(port)
        proc, again = harness.start_redis(tmp_path, port=port)
        assert again == port and harness.redis_ping(port)
    finally:
        harness.stop(proc)


def test_a_work_dir_is_removed_after_a_run_kept_after_a_failure_or_when_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(harness.tempfile, "tempdir", str(tmp_path))
    with harness.work_dir("run-") as done:
        (done / "log").write_text("a run")
    assert not done.exists()
    with pytest.raises(RuntimeError), harness.work_dir("run-") as failed:
        (failed / "log").write_text("a run that fails")
        raise RuntimeError
    assert (failed / "log").exists()  # kept, for a look
    assert str(failed) in capsys.readouterr().err
    given = tmp_path / "given"
    with harness.work_dir("run-", given) as used:
        (used / "log").write_text("kept")
    assert used == given and (given / "log").exists()
