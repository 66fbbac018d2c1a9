"""A zombie worker (frozen past its leases, resumed after the crawl finished) cannot bring
the finished crawl back: its acks are refused, and so are the children of its pages.

What it held when it froze it may still download once: requests it had handed to the
downloader whose bytes had not reached the site yet (a duplicate the guarantees allow, as its
lease expired, and bounded by what it held). It adds nothing else: no page it learnt of after
the freeze.
"""

from __future__ import annotations

import re
import signal
import time
from collections import Counter
from typing import TYPE_CHECKING, cast

from tests.test_crash import worker

if TYPE_CHECKING:
    import subprocess
    from pathlib import Path

    import redis

    from tests.conftest import Site

#: The first answer of list page 3 takes this long: the victim is frozen while it waits.
SLOW_LIST = 3
SLOW_SECONDS = 4


def working_keys(redis_client: redis.Redis) -> set[bytes]:
    """Keys of the crawl but its checkpoints (which keep their TTL) and its counters (kept
    after the crawl, for the operator)."""
    keys = cast("list[bytes]", redis_client.keys("ha:{catalogue}:*"))
    return {k for k in keys if b":cp:" not in k and b":stats" not in k}


def wait_for_hit(site: Site, path: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not any(entry[1] == path for entry in site.log()):
        assert proc.poll() is None, "the worker ended early"
        assert time.monotonic() < deadline, f"{path} never requested within {timeout} s"
        time.sleep(0.02)


def test_a_worker_resumed_after_the_crawl_finished_adds_nothing(
    redis_url: str, redis_client: redis.Redis, site_factory: type[Site], tmp_path: Path
) -> None:
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
        # cleared: the entry counter and the stopped worker's child number (and its entry in
        # senders) stay: it is alive; the record that the crawl finished is there, the
        # workers seen (for `scrapy-ha report`) and the crawl's runs
        assert working_keys(redis_client) == {
            b"ha:{catalogue}:run",
            b"ha:{catalogue}:seq",
            b"ha:{catalogue}:sent",
            b"ha:{catalogue}:senders",
            b"ha:{catalogue}:finish",
            b"ha:{catalogue}:seen",
        }
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
    # nothing crawled again but what the victim held at the freeze, each at most once: the
    # items of the list pages it had parsed before it asked for the slow one
    again = Counter(site.hits()) - Counter(hits_when_finished)
    held = {f"/item/{i}" for i in range(1, (SLOW_LIST - 1) * per_page + 1)}
    assert set(again) <= held, (again, zombie[-3000:])
    assert max(again.values(), default=0) <= 1, again
    # the resumed worker left: its number went (the workers seen stay, for the report)
    still_finished = {b"ha:{catalogue}:seq", b"ha:{catalogue}:finish", b"ha:{catalogue}:seen"}
    still_finished.add(b"ha:{catalogue}:run")
    assert working_keys(redis_client) == still_finished
