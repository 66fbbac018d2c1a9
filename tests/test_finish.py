"""What a finished crawl leaves behind, and how the next run finds it: a sharded finish is all
or nothing against a worker that starts meanwhile; a finished crawl may run again with
another HA_SHARDS, its dead letters still found; the ``sent`` fields of workers that are gone
are pruned. Real redis-server, real crawls (and a SIGKILLed `scrapy crawl` process)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import signal
import time
from functools import partial
from typing import TYPE_CHECKING, Any

import pytest
import redis
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.config.validate import ConfigError
from scrapy_ha.ops.shards import crawl_queue, dead_letters
from scrapy_ha.store.sharding import check_shard_count, make_queue
from scrapy_ha.store.wire import NewEntry
from tests.spiders import CatalogueSpider
from tests.test_cli import scrapy_ha
from tests.test_crash import wait_for_items, worker
from tests.test_redis_failover import crawl_settings

if TYPE_CHECKING:
    from pathlib import Path

    from tests.conftest import Site

SHARDS = [f"ha:{{catalogue:{i}}}" for i in range(4)]
#: Seconds a test waits for a worker to make progress before it fails.
PATIENCE = 60.0


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


class Hooked(redis.asyncio.Redis):
    """A client that awaits ``hook`` before each command it sends (the finishing worker's)."""

    hook: Any = None

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if self.hook is not None:
            await self.hook(args)
        return await super().execute_command(*args, **options)


def fingerprints(client: redis.Redis, shards: int = 4) -> list[int]:
    return [int(client.hget(f"{SHARDS[i]}:buckets", "n") or 0) for i in range(shards)]


async def waiting_for(check: Any, what: str) -> None:
    deadline = time.monotonic() + PATIENCE
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {PATIENCE:g} s"
        await asyncio.sleep(0.05)


def dead_letter_some(url: str, names: list[str], shards: int) -> list[str]:
    """Dead-letter one request per name in a crawl of *shards* shards; their ids."""

    async def run() -> list[str]:
        client = redis.asyncio.Redis.from_url(url)
        queue = make_queue(client, "ha", "catalogue", shards)
        await check_shard_count(queue)
        entries = [NewEntry(hashlib.sha1(n.encode()).digest()[:12], 0, b"{}") for n in names]
        await queue.sync(enqueue=entries)
        ids = []
        for lease in (await queue.sync(lease=len(names))).leases:
            await queue.dead_letter(lease.id, lease.token, {"class": "gone", "reason": "404"})
            ids.append(lease.id)
        await client.aclose()
        return ids

    return asyncio.run(run())


# -- issue 36 item 9: a sharded finish is all or nothing ---------------------------------------


@deferred_f_from_coro_f
async def test_a_worker_starting_while_a_sharded_finish_clears_waits_for_all_of_it(
    redis_url: str, site: Site, caplog: pytest.LogCaptureFixture
) -> None:
    """The last worker clears the shards one after the other (each is another slot). A worker
    that registered between two of them left some shards cleared and others not (shard 0's
    dupefilter kept the earlier run's fingerprints): the new run filtered part of the site."""
    caplog.set_level(logging.INFO)
    first = get_crawler(
        CatalogueSpider, crawl_settings(redis_url, SCHEDULER_PERSIST=True, HA_SHARDS=4)
    )
    await first.crawl_async(base_url=site.url)
    assert len(first.spider.items) == 50
    sync = redis.Redis.from_url(redis_url)
    assert all(fingerprints(sync))
    second = get_crawler(CatalogueSpider, crawl_settings(redis_url, HA_SHARDS=4))
    started: list[asyncio.Task[Any]] = []

    def registered_or_waiting() -> bool:
        alive = sync.zcount(f"{SHARDS[0]}:workers", int(time.time() * 1000), "+inf")
        return bool(alive) or "being cleared by its finish" in caplog.text

    async def start_between_two_shards(_: Any) -> None:
        if started or not 0 < fingerprints(sync).count(0) < 4:
            return  # before the first shard's clearing, or after the last one
        started.append(asyncio.ensure_future(second.crawl_async(base_url=site.url)))
        await waiting_for(registered_or_waiting, "registration of the second worker")

    client = Hooked.from_url(redis_url)
    client.hook = start_between_two_shards
    finisher = make_queue(client, "ha", "catalogue", 4)
    ended = await finisher.finish("finisher")
    client.hook = None
    assert started, "the finish never had some shards cleared and others not"
    await started[0]
    await client.aclose()
    assert ended, "the finish stopped half-way"
    assert len(second.spider.items) == 50, (
        f"the second run found {50 - len(second.spider.items)} item(s) filtered by fingerprints "
        "of the first one: a half-done finish"
    )
    sync.close()


@deferred_f_from_coro_f
async def test_a_finish_whose_worker_died_while_clearing_is_completed_by_the_next_worker(
    redis_url: str, site: Site, caplog: pytest.LogCaptureFixture
) -> None:
    """The finish decided ('commit' recorded), cleared two shards of four, and its worker died:
    the next worker clears the other two before it joins, then crawls the whole site."""
    first = get_crawler(
        CatalogueSpider, crawl_settings(redis_url, SCHEDULER_PERSIST=True, HA_SHARDS=4)
    )
    await first.crawl_async(base_url=site.url)
    sync = redis.Redis.from_url(redis_url)
    sync.set("ha:{catalogue}:finish", f"commit dead0token {int(time.time() * 1000) - 1}")
    sync.delete(*(f"{SHARDS[i]}:{name}" for i in (0, 1) for name in ("buckets", "lseq")))
    assert fingerprints(sync)[:2] == [0, 0] and all(fingerprints(sync)[2:])
    second = get_crawler(CatalogueSpider, crawl_settings(redis_url, HA_SHARDS=4))
    with caplog.at_level(logging.WARNING, logger="scrapy_ha.store.join"):
        await second.crawl_async(base_url=site.url)
    assert len(second.spider.items) == 50, "fingerprints of the first run filtered the second"
    assert "stopped while its finish cleared its 4 shards" in caplog.text
    sync.close()


@deferred_f_from_coro_f
async def test_the_fence_keeps_a_finish_from_starting_or_deciding_against_a_join(redis_url):
    """A finish does not begin while a worker joined lately (its heartbeat may not be in shard
    0 yet); a finish that died while it was still checking is forgotten by the next join
    once its deadline passed (nothing was cleared)."""
    client = redis.asyncio.Redis.from_url(redis_url)
    queue = make_queue(client, "ha", "catalogue", 3)
    now = int(time.time() * 1000)
    await client.zadd("ha:{catalogue}:joins", {"w1": now + 60_000})
    assert not await queue.finish("f")
    assert not await client.exists("ha:{catalogue}:finish")
    await client.delete("ha:{catalogue}:joins")
    await client.set("ha:{catalogue}:finish", f"prepare 0dead {now - 1}")
    from scrapy_ha.store.join import join_crawl  # noqa: PLC0415 (the module is the fix)

    joined = await join_crawl(
        client, "ha", "catalogue", shards=3, worker="w2", registration_ms=30_000
    )
    assert (joined.shards, joined.span) == (3, 3)
    assert not await client.exists("ha:{catalogue}:finish")
    assert await client.zscore("ha:{catalogue}:joins", "w2")
    await client.aclose()


# -- issue 36 item 7: a finished crawl runs again with another HA_SHARDS -----------------------


@deferred_f_from_coro_f
async def test_a_finished_sharded_crawl_runs_again_with_fewer_shards_its_dead_letters_found(
    redis_url: str, site: Site
) -> None:
    """HA_SHARDS=4, finished with dead letters on every shard, then HA_SHARDS=2: the second
    run is not refused (a finish never deleted the shard count, and `flush` would have
    deleted the dead letters a finish keeps); shards 2 and 3 stay in the crawl's layout, so
    the tools list their dead letters, a requeued one is leased, and `flush` deletes them."""
    ids = await asyncio.to_thread(dead_letter_some, redis_url, [f"gone-{i}" for i in range(24)], 4)
    assert {i.partition(":")[0] for i in ids if ":" in i} == {"1", "2", "3"}
    first = get_crawler(CatalogueSpider, crawl_settings(redis_url, HA_SHARDS=4))
    await first.crawl_async(base_url=site.url)
    assert len(first.spider.items) == 50
    sync = redis.Redis.from_url(redis_url)
    assert sync.get("ha:{catalogue}:finish") == b"done"
    second = get_crawler(CatalogueSpider, crawl_settings(redis_url, HA_SHARDS=2))
    await second.crawl_async(base_url=site.url)
    assert len(second.spider.items) == 50, "the second run was refused or filtered"
    assert sync.get("ha:{catalogue}:shards") == b"2 4"
    assert all(sync.zcard(f"{SHARDS[i]}:ready") == 0 for i in range(4))
    client = redis.asyncio.Redis.from_url(redis_url)
    queue = await crawl_queue(client, "ha", "catalogue", 2)
    listed = [e.id for e in await dead_letters(queue).entries()]
    assert sorted(listed) == sorted(ids)
    far = next(i for i in ids if i.startswith("3:"))
    assert await dead_letters(queue).requeue([far]) == 1
    leased = (await queue.sync(lease=10)).leases
    assert [x.id for x in leased] == [far]  # shard 3 is leased from, though beyond the count
    status = json.loads(
        (await asyncio.to_thread(scrapy_ha, "--redis-url", redis_url, "status", "catalogue",
                                 "--json")).stdout
    )  # fmt: skip
    assert status["totals"]["dead"] == 24 and status["totals"]["acked"] == 2 * 55
    await client.aclose()
    flushed = await asyncio.to_thread(
        scrapy_ha, "--redis-url", redis_url, "flush", "catalogue", "--yes", "--force"
    )
    assert flushed.returncode == 0, flushed.stderr
    assert sync.keys("ha:{catalogue*") == []
    sync.close()


@deferred_f_from_coro_f
async def test_an_unsharded_crawl_goes_sharded_once_its_dead_letters_are_handled(
    redis_url: str, site: Site, caplog: pytest.LogCaptureFixture
) -> None:
    """One shard to several: the hash tags differ, so a finished run's dead letters would be
    out of reach of the new layout: refused while it keeps any, with the way out; then the
    crawl runs sharded, and the counters left under the old tag are deleted."""
    await asyncio.to_thread(dead_letter_some, redis_url, ["gone-a", "gone-b"], 1)
    first = get_crawler(CatalogueSpider, crawl_settings(redis_url))
    await first.crawl_async(base_url=site.url)
    assert len(first.spider.items) == 50
    refused = get_crawler(CatalogueSpider, crawl_settings(redis_url, HA_SHARDS=3))
    hits = sum(site.hits().values())
    await refused.crawl_async(base_url=site.url)
    assert sum(site.hits().values()) == hits  # it crawled nothing
    assert "finished unsharded (HA_SHARDS=1) and keeps 2 dead letter(s) and 0 request(s)" in (
        caplog.text
    )
    purged = await asyncio.to_thread(
        scrapy_ha, "--redis-url", redis_url, "dlq", "purge", "catalogue", "--all", "--yes"
    )
    assert purged.returncode == 0, purged.stderr
    caplog.clear()
    third = get_crawler(CatalogueSpider, crawl_settings(redis_url, HA_SHARDS=3))
    with caplog.at_level(logging.INFO, logger="scrapy_ha.store.join"):
        await third.crawl_async(base_url=site.url)
    assert len(third.spider.items) == 50
    assert "counters the finished run kept on its 1 hash tag(s) are deleted" in caplog.text
    sync = redis.Redis.from_url(redis_url)
    assert sync.get("ha:{catalogue}:shards") == b"3"
    assert not sync.exists("ha:{catalogue}:stats", "ha:{catalogue}:seq")
    sync.close()


@deferred_f_from_coro_f
async def test_a_sharded_crawl_goes_unsharded_once_finished_without_dead_letters(redis_url):
    """Several shards to one: refused while the finished run keeps a dead letter on a shard;
    once it is purged, the worker takes the crawl over and the shards' counters go."""
    from scrapy_ha.store.join import join_crawl  # noqa: PLC0415 (the module is the fix)

    ids = await asyncio.to_thread(dead_letter_some, redis_url, ["gone-x"], 3)
    client = redis.asyncio.Redis.from_url(redis_url)
    queue = make_queue(client, "ha", "catalogue", 3)
    assert await queue.finish("w0")
    join = partial(join_crawl, client, "ha", "catalogue", shards=1, registration_ms=30_000)
    with pytest.raises(ConfigError, match=r"finished with HA_SHARDS=3 and keeps 1 dead letter"):
        await join(worker="w1")
    assert await dead_letters(queue).purge(ids) == 1
    joined = await join(worker="w1")
    assert (joined.shards, joined.span, joined.replaced) == (1, 1, "3")
    left = await client.keys("ha:{catalogue*")
    # this worker's registration, and the finish record naming its join (written back as
    # "done" if it is refused at start before another worker joins: store/join.py)
    assert sorted(left) == [b"ha:{catalogue}:finish", b"ha:{catalogue}:workers"], left
    assert await client.get("ha:{catalogue}:finish") == b"joined w1"
    await client.aclose()


# -- issue 36 item 8: the `sent` fields of workers that are gone -------------------------------


def test_a_killed_workers_number_in_sent_goes_a_day_after_it_was_seen_gone(
    redis_url: str, site_factory: type[Site], tmp_path: Path
) -> None:
    """`sent` gained one field per killed worker for ever (only a worker that leaves deletes
    its own). A worker that joins (or a finish) marks the workers whose heartbeat expired
    gone, and deletes the numbers of those gone for a day: a worker frozen less than that
    (test_zombie.py) finds its number when it comes back. The day is simulated by moving
    the mark back."""
    site = site_factory("--pages", "20", "--per-page", "20", "--delay", "0.01")
    items, log = tmp_path / "a.jl", tmp_path / "a.log"
    killed = worker(redis_url, site.url, items, log)
    wait_for_items(items, 40, killed)
    killed.send_signal(signal.SIGKILL)
    killed.wait(10)
    client = redis.Redis.from_url(redis_url)
    ((nonce, _),) = client.hgetall("ha:{catalogue}:sent").items()
    deadline = time.monotonic() + PATIENCE
    while client.zcount("ha:{catalogue}:workers", int(time.time() * 1000), "+inf"):
        assert time.monotonic() < deadline, "the killed worker's heartbeat never expired"
        time.sleep(0.1)

    def join_and_stop(name: str) -> None:  # stops early: its close is no finish
        proc = worker(redis_url, site.url, tmp_path / f"{name}.jl", tmp_path / f"{name}.log",
                      CLOSESPIDER_ITEMCOUNT="5")  # fmt: skip
        assert proc.wait(PATIENCE) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
        assert "closespider_itemcount" in (tmp_path / f"{name}.log").read_text()

    join_and_stop("b")
    assert list(client.hkeys("ha:{catalogue}:sent")) == [nonce]  # gone since the join: kept
    found = re.search(r"keys \S+, worker (\S+)", log.read_text())
    assert found, "the killed worker's id is not in its log"
    mark = client.hget("ha:{catalogue}:senders", found.group(1))
    day_ago = int(time.time() * 1000) - 24 * 3600 * 1000 - 1
    client.hset("ha:{catalogue}:senders", found.group(1), b"%s %d" % (nonce, day_ago))
    join_and_stop("c")
    assert client.hlen("ha:{catalogue}:sent") == 0, client.hgetall("ha:{catalogue}:sent")
    assert client.hlen("ha:{catalogue}:senders") == 0
    assert mark is not None and mark.startswith(nonce + b" "), f"not marked gone: {mark!r}"
    client.close()
