"""The dead-letter alert of a sharded crawl (``HA_SHARDS > 1``): its queue is every shard's,
which a worker counts one shard at a time before the script decides, so the count can be
older than the marker the script finds. A real redis-server, the benchmarks' delay line
(bench/latency_proxy.py) for a worker far from Redis, a real local webhook receiver."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis.asyncio
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.deadletters.alerts import DeadLetterAlert
from scrapy_ha.demo import harness
from scrapy_ha.store.sharding import make_queue
from tests.test_alerts import Receiver
from tests.test_shards import entry

if TYPE_CHECKING:
    from collections.abc import Iterator

DELAY_LINE = Path(__file__).resolve().parent.parent / "bench" / "latency_proxy.py"
#: Milliseconds the far worker's line delays each way: its count (three shards, one round
#: trip each) spans 1.5 s, its decision reaches Redis 0.5 s after its last shard was read.
DELAY_MS = 250


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@deferred_f_from_coro_f
async def test_a_count_taken_before_a_crossing_keeps_that_crossing_s_marker(
    redis_url, redis_server, receiver
):
    """The far worker counted 19 of the threshold's 20; meanwhile a near worker's dead
    letter crossed it and its alert was sent. The far worker's check, below the threshold
    by its count, took the marker away, and the next dead letter alerted again: two POSTs
    for one crossing."""
    near_client = redis.asyncio.Redis.from_url(redis_url)
    queue = make_queue(near_client, "ha", "faults", 3)
    await queue.sync(enqueue=[entry(f"u{i}") for i in range(40)])
    leases = (await queue.sync(lease=40, lease_ms=600_000)).leases
    home = [x for x in leases if ":" not in x.id][:2]  # two of shard 0, kept for later
    for x in [x for x in leases if x not in home][:19]:
        await queue.dead_letter(x.id, x.token, {"class": "gone", "reason": "HTTP 404"})

    line = [sys.executable, str(DELAY_LINE), "--to", str(redis_server.port)]
    proc = harness.spawn([*line, "--delay-ms", str(DELAY_MS)], stdout=subprocess.PIPE)
    far_client = redis.asyncio.Redis(port=harness.read_listening(proc, "the delay line")[0])
    try:
        await far_client.select(int(redis_url.rsplit("/", 1)[1]))
        far_queue = make_queue(far_client, "ha", "faults", 3)
        stats = MemoryStatsCollector(get_crawler())
        far = DeadLetterAlert(receiver.url, 20, stats, "far")
        near = DeadLetterAlert(receiver.url, 20, stats, "near")
        counting = asyncio.ensure_future(far.check(far_queue))  # (after its 19th)
        await asyncio.sleep(3 * DELAY_MS / 1000)  # shard 0 counted, the others not yet
        await queue.dead_letter(home[0].id, home[0].token, {"class": "gone"})
        await near.check(queue)  # 20: the crossing, the alert
        await near.close()
        await counting
        await far.close()
        await queue.dead_letter(home[1].id, home[1].token, {"class": "gone"})
        await near.check(queue)  # 21: the same crossing
        await near.close()
    finally:
        await far_client.aclose()
        harness.stop(proc)
        await near_client.aclose()
    assert [(p["worker"], p["dead"]) for p in receiver.posts] == [("near", 20)]


@deferred_f_from_coro_f
async def test_the_check_of_many_shards_costs_a_few_round_trips(redis_url, redis_client, receiver):
    """After each dead letter the worker's check counted the shards one round trip each,
    awaited by the worker's round: 66 round trips for 64 shards (166 ms a dead letter with
    Redis 1 ms away). Counted as the server's read events, one per round trip."""
    client = redis.asyncio.Redis.from_url(redis_url)
    stats = MemoryStatsCollector(get_crawler())
    alert = DeadLetterAlert(receiver.url, 100, stats, "w")
    try:
        queue = make_queue(client, "ha", "faults", 64)
        await client.ping()  # (connected before counting)
        before = redis_client.info("stats")["total_reads_processed"]
        await alert.check(queue)
        reads = redis_client.info("stats")["total_reads_processed"] - before
    finally:
        await client.aclose()
    assert reads <= 8, reads  # (the check's few round trips, this INFO, and some slack)
