"""Redis refusing a worker's rounds (a server over its maxmemory): said once a minute while
it lasts, naming the full server (a Redis Cluster's primary too), not an ERROR a second
(a QA run: a master over maxmemory made workers log an ERROR each second, no node named).
Real redis-servers, a real worker crawling a real site."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import TYPE_CHECKING

import pytest
import redis
import redis.asyncio
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.config.scheduler import DeadLetterConfig
from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.outbox import CheckpointSave, Outbox
from scrapy_ha.scheduler.session.ends import Ends
from scrapy_ha.scheduler.session.rejected import SAY_EVERY, Rejections
from scrapy_ha.scheduler.session.sync import Syncer
from scrapy_ha.store.connection import redis_from_settings
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry
from tests import redis_servers
from tests.test_checkpoint_garbage import ids_in
from tests.test_checkpoints import run_paged

if TYPE_CHECKING:
    from pathlib import Path

OVER = "is over its maxmemory"


def _oom_count(client: redis.Redis) -> int:
    return int(client.info("errorstats").get("errorstat_OOM", {}).get("count", 0))


def test_a_full_redis_is_said_once_a_minute_and_nothing_is_lost(site_factory, tmp_path: Path):
    server = redis_servers.start(tmp_path / "redis")
    client = server.client()
    site = site_factory("--pages", "6", "--per-page", "5", "--slow-list", "3:3")
    items, log = tmp_path / "items.jl", tmp_path / "worker.log"
    worker = run_paged(f"redis://127.0.0.1:{server.port}/0", site.url, items, log)
    try:
        deadline = time.monotonic() + 60
        while "/list/3" not in site.hits():  # its page 2 is done: a round has acks to send
            assert worker.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        client.config_set("maxmemory", 1)  # over it at once: every write is refused
        full_at = time.monotonic()
        while len(ids_in(items)) < 15:  # page 3 processed: its checkpoint, ack, next page
            assert worker.poll() is None and time.monotonic() < deadline + 60
            time.sleep(0.05)
        refused = _oom_count(client)
        while _oom_count(client) < refused + 12 or OVER not in log.read_text():
            assert worker.poll() is None and time.monotonic() < deadline + 120
            time.sleep(0.1)
        client.config_set("maxmemory", 0)
        minutes = (time.monotonic() - full_at) // SAY_EVERY
        assert worker.wait(timeout=120) == 0
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGKILL)
        server.kill()
    text = log.read_text()
    said = [line for line in text.splitlines() if "] ERROR:" in line]
    assert all(OVER in line for line in said), said
    assert 1 <= len(said) <= 1 + minutes, said  # not one a second (12 refusals or more)
    assert "used_memory" in said[0] and "of maxmemory 1 bytes" in said[0]
    # the server (before: "Redis is over its maxmemory", on a machine of several)
    assert f"Redis at redis://127.0.0.1:{server.port}/0 is over its maxmemory" in said[0], said
    assert "'ha/redis_refused':" in text
    # kept and sent again, not dropped (a checkpoint) nor dead-lettered (a retry)
    assert "ha/checkpoint/failed" not in text and "ha/op_errors" not in text
    assert ids_in(items) == list(range(1, 31))  # nothing lost, nothing twice


@deferred_f_from_coro_f
async def test_the_full_primary_of_a_cluster_is_named(tmp_path: Path, caplog):
    cluster = redis_servers.start_cluster(tmp_path / "cluster", replicas=0)
    client = redis_from_settings(Settings({"REDIS_URL": cluster.url}), connect_timeout=5)
    try:
        full = cluster.owner_of("k")
        assert full is not None
        with full.client() as node:
            node.config_set("maxmemory", 1)
        with pytest.raises(redis.exceptions.OutOfMemoryError) as refused:
            await client.set("k", "v")  # a real refusal, from the full master
        others = [n for n in cluster.nodes if n is not full]
        stats = get_crawler().stats
        clock = [0.0]
        said = Rejections(stats, clock=lambda: clock[0])
        with caplog.at_level(logging.ERROR, logger="scrapy_ha.scheduler.session.rejected"):
            for second in range(5):
                clock[0] = float(second)
                await said.refused(refused.value, client)
            clock[0] = SAY_EVERY + 1
            await said.refused(refused.value, client)
    finally:
        await client.aclose()
        cluster.stop()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines  # the first, then a minute later
    assert f"the primary 127.0.0.1:{full.port}, used_memory" in lines[0]
    assert not any(f":{n.port}" in lines[0] for n in others)
    assert "(4 more since it was last said)" in lines[1]
    assert stats.get_value("ha/redis_refused") == 6


@deferred_f_from_coro_f
async def test_another_refusal_is_said_at_once(caplog):
    """Each kind of refusal is said the first time, whatever was said just before."""
    said = Rejections(get_crawler().stats, clock=lambda: 0.0)
    with caplog.at_level(logging.ERROR, logger="scrapy_ha.scheduler.session.rejected"):
        await said.refused(redis.exceptions.ResponseError("NOPERM this user has no ..."), None)
        await said.refused(redis.exceptions.ResponseError("NOPERM this user has no ..."), None)
        await said.refused(redis.exceptions.ResponseError("ERR unknown command"), None)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "NOPERM" in lines[0] and "unknown command" in lines[1], lines


@deferred_f_from_coro_f
async def test_refusals_that_take_turns_are_each_said_once_a_minute(caplog, redis_url):
    """A review: only the last refusal said was remembered, so two that took turns (the
    sync function's and a script's, each named in Redis's words) were each said every time."""
    clock = [0.0]
    said = Rejections(get_crawler().stats, redis_url, clock=lambda: clock[0])
    oom = "command not allowed when used memory > 'maxmemory'."
    turns = [
        redis.exceptions.OutOfMemoryError(oom),
        redis.exceptions.OutOfMemoryError(f"{oom} script: 614d8c5, on @user_script:440."),
        redis.exceptions.ResponseError("NOPERM this user has no permissions"),
        redis.exceptions.ResponseError("NOPERM this user has no permissions"),
    ]
    client = redis.asyncio.Redis.from_url(redis_url)  # (its memory is read: not full)
    with caplog.at_level(logging.ERROR, logger="scrapy_ha.scheduler.session.rejected"):
        for second in range(20):
            clock[0] = float(second)
            await said.refused(turns[second % len(turns)], client)
    await client.aclose()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines  # the full Redis once, the NOPERM once
    assert lines[1].startswith(f"Redis at {redis_url} refused a scrapy-ha command"), lines


@pytest.fixture
def full(tmp_path: Path):
    """A real Redis whose memory is full at will (``config_set("maxmemory", 1)``)."""
    server = redis_servers.start(tmp_path / "redis")
    yield server
    server.kill()


async def _leased(server: redis_servers.Server) -> tuple[RedisQueue, object]:
    queue = RedisQueue(redis.asyncio.Redis(port=server.port), Keys("ha", "full"))
    await queue.enqueue([NewEntry(b"fp", 0, b'{"v":1,"u":"http://a.test/1"}')])
    (lease,) = await queue.lease(1, 60_000)
    return queue, lease


@deferred_f_from_coro_f
async def test_a_checkpoint_refused_for_memory_is_kept_not_dropped(full):
    queue, lease = await _leased(full)
    syncer = object.__new__(Syncer)
    syncer.outbox = Outbox()
    syncer.stats = get_crawler().stats
    syncer.ends = Ends(syncer.stats, DeadLetterConfig())
    syncer.ends.queue = queue
    save = CheckpointSave(lease.id, lease.token, "t", b'{"page": 2}', 60_000)
    syncer.outbox.checkpoints.append(save)
    with full.client() as admin:
        admin.config_set("maxmemory", 1)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            await syncer.save_checkpoints()
        assert syncer.outbox.checkpoints == [save]  # kept: sent again by the next round
        admin.config_set("maxmemory", 0)
    await syncer.save_checkpoints()
    assert syncer.outbox.checkpoints == []
    assert syncer.stats.get_value("ha/checkpoint/saved") == 1
    assert syncer.stats.get_value("ha/checkpoint/failed") is None
    await queue.client.aclose()


@deferred_f_from_coro_f
async def test_a_full_redis_renews_the_leases_of_live_workers(full):
    """Before, a renewal was refused while Redis was over its maxmemory (its first write
    could grow memory): a live worker's leases expired, and their pages were reclaimed and
    done twice. Its first write cannot grow memory now, and Redis runs the rest."""
    queue, lease = await _leased(full)
    before = await queue.client.zscore(queue.keys.leased, lease.id)
    with full.client() as admin:
        admin.config_set("maxmemory", 1)
        start = admin.time()
        while admin.time()[0] == start[0] and admin.time()[1] < start[1] + 20_000:
            await asyncio.sleep(0.005)  # Redis's clock moves on: a later expiry
        renewed, lost = await queue.renew(
            [(lease.id, lease.token)], worker="w", lease_ms=60_000, heartbeat_ms=60_000
        )
        admin.config_set("maxmemory", 0)
    assert (renewed, lost) == (1, [])
    assert await queue.client.zscore(queue.keys.leased, lease.id) > before
    await queue.client.aclose()
