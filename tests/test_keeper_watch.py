"""The WARNING a late tick of the event loop gives says whether leases were renewed while
the loop stalled (``LoopWatch``, ``scrapy_ha/scheduler/session/keeper.py``). The keeper is a
stand-in here: what matters is when it applied its renewals against the tick's times (the
real process, stopped with SIGSTOP: tests/test_keeper.py)."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING

from scrapy_ha.scheduler.session.keeper import LoopWatch

if TYPE_CHECKING:
    import pytest

LATE = 5.0


def _late_tick(applied_ago: list[float], caplog: pytest.LogCaptureFixture) -> str:
    """The WARNING of a tick *LATE* seconds late, the keeper having applied renewals the
    given seconds before it."""
    now = time.monotonic()
    keeper = SimpleNamespace(
        loop=SimpleNamespace(call_later=lambda *a: None),
        interval=1.0,
        applied=[now - ago for ago in applied_ago],
        renewals=len(applied_ago),  # (the count the tree before read)
        beat=lambda: None,
        hold=lambda held: None,
        hand=lambda handed: None,
    )
    watch = LoopWatch(keeper, held=tuple)  # type: ignore[arg-type]
    watch._due = now - LATE
    with caplog.at_level(logging.WARNING):
        watch._tick()
    (record,) = [r for r in caplog.records if "event loop was blocked" in r.getMessage()]
    return record.getMessage()


def test_a_renewal_made_as_the_stopped_process_woke_is_not_one_made_meanwhile(caplog):
    """A suite run on a busy machine: after SIGCONT the keeper's thread renewed before the
    loop's late tick, and the WARNING said leases "were renewed from scrapy-ha's own thread
    meanwhile" of a process that was stopped whole."""
    said = _late_tick([0.01], caplog)
    assert "no lease was renewed meanwhile (the process was stopped" in said, said


def test_a_renewal_made_while_the_loop_stalled_is_said(caplog):
    said = _late_tick([LATE - 0.5, 0.01], caplog)
    assert "leases were renewed from scrapy-ha's own thread meanwhile" in said, said


def test_a_renewal_made_before_the_tick_was_due_is_not_one_made_meanwhile(caplog):
    said = _late_tick([LATE + 0.3], caplog)
    assert "no lease was renewed meanwhile" in said, said
