"""A zombie worker (frozen past its leases, resumed after the crawl finished) cannot bring
the finished crawl back: its acks are refused, and so are the children of its pages."""

from __future__ import annotations

import re
import signal
import time

from tests.test_crash import worker

#: The first answer of list page 3 takes this long: the victim is frozen while it waits.
SLOW_LIST = 3
SLOW_SECONDS = 4


def working_keys(redis_client) -> set[bytes]:
    """Keys of the crawl but its checkpoints (which keep their TTL)."""
    return {k for k in redis_client.keys("ha:{catalogue}:*") if b":cp:" not in k}


def wait_for_hit(site, path: str, proc, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not any(entry[1] == path for entry in site.log()):
        assert proc.poll() is None, "the worker ended early"
        assert time.monotonic() < deadline, f"{path} never requested within {timeout} s"
        time.sleep(0.02)


def test_a_worker_resumed_after_the_crawl_finished_adds_nothing(
    redis_url, redis_client, site_factory, tmp_path
):
    pages, per_page = 6, 10
    site = site_factory(
        "--pages",
        str(pages),
        "--per-page",
        str(per_page),
        "--slow-list",
        f"{SLOW_LIST}:{SLOW_SECONDS}",
    )
    items = tmp_path / "items.jl"
    victim = worker(redis_url, site.url, items, tmp_path / "victim.log")
    try:
        wait_for_hit(site, f"/list/{SLOW_LIST}", victim)
        victim.send_signal(signal.SIGSTOP)  # frozen while it holds the list page's lease
        survivor = worker(redis_url, site.url, items, tmp_path / "survivor.log")
        assert survivor.wait(timeout=120) == 0, (tmp_path / "survivor.log").read_text()[-3000:]
        log = (tmp_path / "survivor.log").read_text()
        assert "'finish_reason': 'finished'" in log
        assert working_keys(redis_client) == {b"ha:{catalogue}:seq"}  # cleared
        hits_when_finished = site.hits()
        victim.send_signal(signal.SIGCONT)  # the list page's answer is there: it parses it
        assert victim.wait(timeout=60) == 0
    finally:
        if victim.poll() is None:
            victim.send_signal(signal.SIGCONT)
            victim.kill()
            victim.wait()
    zombie = (tmp_path / "victim.log").read_text()
    refused = re.search(r"'ha/children_refused': (\d+)", zombie)
    # the list page's items and its next page were refused
    assert refused and int(refused.group(1)) >= per_page, zombie[-3000:]
    assert site.hits() == hits_when_finished  # nothing crawled again
    assert working_keys(redis_client) == {b"ha:{catalogue}:seq"}  # still finished
