"""The item outbox's scenario of the chaos suite (chaos/items.py), full size: 3 workers and
10,000 items, 8 random SIGKILLs of workers, one worker frozen past its leases, an SQL
consumer SIGKILLed twice mid-batch: every item exactly once in every sink. The short version
(1,000 items, 3 kills) runs in `make test` with the other short scenarios
(tests/test_chaos_short.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from chaos.run import run_scenario  # noqa: E402


@pytest.mark.long  # about 2 minutes here: `make test-long`
def test_every_item_once_in_every_sink_under_kills_a_freeze_and_sink_kills() -> None:
    result = run_scenario("items", short=False)
    assert result["expected"] == 10_000, result
    assert (result["jsonl_lost"], result["jsonl_twice"]) == (0, 0), result
    assert (result["sql_lost"], result["sql_twice"]) == (0, 0), result
    assert result["committed"] == 10_000 and result["left_in_stream"] == 0, result
    assert result["sink_kills_mid_batch"] == 2, result
    assert result["ok"], result
