"""The short chaos suite (``chaos/run.py --short``), one test per scenario."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from chaos.run import SCENARIOS, run_scenario  # noqa: E402


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scenario_loses_nothing(scenario: str) -> None:
    result = run_scenario(scenario, short=True)
    assert result["lost"] == 0, result
    assert result["twice"] <= result["bound"], result
    assert result["ok"], result
