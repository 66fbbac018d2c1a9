"""The short chaos suite (``chaos/run.py --short``), one test per scenario."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from chaos.run import SCENARIOS, Cluster, run_scenario  # noqa: E402


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scenario_loses_nothing(scenario: str) -> None:
    result = run_scenario(scenario, short=True)
    assert result["lost"] == 0, result
    assert result["twice"] <= result["bound"], result
    assert result["ok"], result


def test_a_worker_restarted_as_the_crawl_ends_crawls_nothing_again(tmp_path: Path) -> None:
    """A worker the scenarios restart (after a kill, after a poison death) can come up once
    the last one has ended the crawl: it must find the crawl done, not crawl the site anew
    (the short poison run failed with 907 of 999 pages twice when it lost that race)."""
    c = Cluster(tmp_path, pages=5)
    try:
        c.start_redis()
        c.start_site()
        c.start_worker(0)
        c.wait_workers()
        assert c.items_count() == 100
        c.start_worker(1)  # the supervisor's restart, up after the end
        c.wait_workers()
        assert c.items_count() == 100
    finally:
        c.stop_all()
