"""`scrapy-ha dlq export`/`requeue` walk the dead letters by score after the last one read:
read by rank, they skipped as many entries as left the queue before them meanwhile (a
queue at its cap drops its oldest as each new dead letter comes)."""

from __future__ import annotations

import threading
import time

from tests.cli_seed import scrapy_ha

KEY = "ha:{capped}:dead"


def _seed(redis_client) -> None:
    now = int(time.time() * 1000)
    redis_client.set("ha:{capped}:seq", 1)  # a crawl exists
    for first in range(0, 60_000, 5_000):  # outside the window: two hours ago
        redis_client.zadd(KEY, {f"o{i}": now - 7_200_000 + i for i in range(first, first + 5_000)})
    redis_client.zadd(KEY, {f"w{i}": now - 100_000 + i for i in range(6_000)})


def _while_the_oldest_leave(redis_client, *args: str):
    """Run ``scrapy-ha`` with *args* while the oldest dead letters leave, 20 at a time."""
    done = threading.Event()

    def trim() -> None:
        i = 0
        while not done.is_set() and i < 2_900:  # (at most 58,000 of the 60,000 old ones)
            redis_client.zpopmin(KEY, 20)
            i += 1
            time.sleep(0.001)

    churn = threading.Thread(target=trim)
    churn.start()
    try:
        return scrapy_ha(*args)
    finally:
        done.set()
        churn.join()


def test_export_and_requeue_choose_every_entry_of_the_window_while_the_oldest_leave(
    redis_url, redis_client
):
    """A QA run: ``dlq export --since 1h`` wrote 19,920 to 19,960 of the 20,000 dead letters
    of its window, and ``dlq requeue --since 1h`` chose 19,920 to 19,940 of them."""
    _seed(redis_client)
    export = _while_the_oldest_leave(
        redis_client, "dlq", "export", "capped", "--since", "1h", "--redis-url", redis_url
    )
    assert export.returncode == 0, export.stderr
    assert len(export.stdout.splitlines()) == 6_000
    redis_client.delete(KEY)
    _seed(redis_client)
    requeue = _while_the_oldest_leave(
        redis_client, "dlq", "requeue", "capped", "--since", "1h", "--dry-run",
        "--redis-url", redis_url,
    )  # fmt: skip
    assert requeue.returncode == 0, requeue.stderr
    assert "would requeue 6,000 entries of capped" in requeue.stdout + requeue.stderr
