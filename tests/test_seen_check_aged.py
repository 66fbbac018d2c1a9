"""``scrapy-ha seen check`` on a crawl kept in time slices (``HA_DUPEFILTER_TTL`` with the
exact set): a URL is said seen only while the scripts that enqueue would filter it. A slot
that ended a TTL ago is dropped only by the crawl's next write, so on a crawl at rest it
stays in Redis: the check said such URLs seen, exit code 0, with a "new again by" time
already past, while a push of the same URL added it. Real redis-server, the console script."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.config.memory import MemoryConfig
from scrapy_ha.keys import Keys
from scrapy_ha.store.sharding import check_shard_count, make_queue, set_dupefilter
from tests.test_bloom import entries
from tests.test_cli import scrapy_ha

TTL = 3600  # seconds: nothing ages by itself while the test runs
KEYS = Keys("ha", "k")


async def age_every_slot(client: redis.asyncio.Redis, seconds: float, key: str = KEYS.aged) -> None:
    """Move the start of every time slice (the fields ``s<i>`` of *key*: the exact set's
    slices' hash, or the Bloom filter's meta hash) *seconds* back, as if the crawl had
    rested so long (what a crawl left alone does: no write drops its slots)."""
    starts = await client.hgetall(key)
    for name, start in starts.items():
        if name[:1] == b"s" and name[1:].isdigit():
            await client.hset(key, name, int(start) - int(seconds * 1000))


async def sliced(client: redis.asyncio.Redis, config: MemoryConfig | None = None) -> Any:
    """The queue of crawl ``k``, its dupefilter (the exact set, or *config*'s) in time
    slices of a TTL of :data:`TTL`."""
    queue = make_queue(client, "ha", "k", 1)
    await check_shard_count(queue)
    await set_dupefilter(queue, config or MemoryConfig(dupefilter="set"), TTL)
    return queue


async def cli(redis_url: str, *args: str):  # noqa: ANN201
    return await asyncio.to_thread(scrapy_ha, "--redis-url", redis_url, *args)


async def pushed_new(redis_url: str, url: str) -> None:
    """*url* pushed to crawl ``k`` (made if need be): added, as a new URL."""
    pushed = await cli(redis_url, "push", "k", "--create", url)
    assert pushed.returncode == 0 and "1 added" in pushed.stdout, pushed.stdout + pushed.stderr


async def fingerprints(redis_url: str) -> int:
    """What ``status`` counts as the crawl's fingerprints (the metrics read the same)."""
    shown = await cli(redis_url, "status", "k", "--json")
    assert shown.returncode == 0, shown.stderr
    return int(json.loads(shown.stdout)["fingerprints"])


@pytest.mark.parametrize("rested", [TTL * 1.2, TTL * 3])
@deferred_f_from_coro_f
async def test_a_url_seen_longer_ago_than_the_ttl_is_not_said_seen(
    redis_url: str, rested: float
) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await sliced(client)
        url = "https://a.example/x"
        await pushed_new(redis_url, url)
        checked = await cli(redis_url, "seen", "check", "k", url)
        assert checked.returncode == 0 and ": seen (in the time slice" in checked.stdout
        assert await fingerprints(redis_url) == 1
        await age_every_slot(client, rested)  # the slot ended more than a TTL ago
        assert await fingerprints(redis_url) == 0  # (it said 1: a fingerprint seen no more)
        checked = await cli(redis_url, "seen", "check", "k", url)
        assert checked.stdout == f"{url}: not seen\n", checked.stdout
        assert checked.returncode == 1
        # the truth the check must tell: the crawl's own script takes the URL as new
        pushed = await cli(redis_url, "push", "k", url)
        assert pushed.returncode == 0 and "1 added" in pushed.stdout, pushed.stdout
        checked = await cli(redis_url, "seen", "check", "k", url)
        assert checked.returncode == 0 and ": seen (in the time slice" in checked.stdout
    finally:
        await client.aclose()


@deferred_f_from_coro_f
async def test_a_url_seen_within_the_ttl_is_still_said_seen(redis_url: str) -> None:
    """Its slot ended less than a TTL ago: a link to it would be filtered."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await sliced(client)
        url = "https://a.example/y"
        await pushed_new(redis_url, url)
        await age_every_slot(client, TTL * 0.8)
        assert await fingerprints(redis_url) == 1
        checked = await cli(redis_url, "seen", "check", "k", url)
        assert checked.returncode == 0 and ": seen (in the time slice" in checked.stdout
        pushed = await cli(redis_url, "push", "k", url)
        assert "0 added, 1 filtered" in pushed.stdout, pushed.stdout
    finally:
        await client.aclose()


@deferred_f_from_coro_f
async def test_a_workers_counts_pass_over_a_garbage_slices_hash(redis_url: str) -> None:
    """A worker's counts count 0 for a key of the frontier of another type (its next sync
    sets it aside): the time slices' hash too, which they now read for its period."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        queue = await sliced(client)
        pushed = await cli(redis_url, "push", "k", "--create", "https://a.example/z")
        assert pushed.returncode == 0 and "1 added" in pushed.stdout, pushed.stderr
        await client.delete(KEYS.aged)
        await client.set(KEYS.aged, "garbage")
        counts = await queue.counts()
        assert counts.pending == 1
    finally:
        await client.aclose()


@deferred_f_from_coro_f
async def test_the_bloom_filters_slices_count_the_urls_still_seen(redis_url: str) -> None:
    """The same count of a Bloom filter in time slices: its URLs held by slices that ended
    a TTL ago, kept until the crawl's next write, filter nothing (status said 1)."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        queue = await sliced(client, MemoryConfig(dupefilter="bloom", capacity=1000))
        assert await queue.enqueue(entries(range(1))) == 1  # as a worker adds it
        assert await fingerprints(redis_url) == 1
        await age_every_slot(client, TTL * 1.2, KEYS.bloom)
        assert await fingerprints(redis_url) == 0
    finally:
        await client.aclose()


@deferred_f_from_coro_f
async def test_a_ttl_raised_by_the_next_run_is_the_ttl_the_tools_read(redis_url: str) -> None:
    """The next run of a crawl at rest has a longer HA_DUPEFILTER_TTL: its workers write in
    the newest slice while it is younger than their period (the TTL / 8), and filter what
    it holds for their TTL. The tools read the TTL from the slices' hash ('period'), which
    only a new slice wrote: for up to the new period, `seen check` said not seen (exit 1)
    and status counted none of what the crawl filters, the new run's own URLs too."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await sliced(client)
        url = "https://a.example/x"
        await pushed_new(redis_url, url)
        await age_every_slot(client, TTL * 1.5)  # at rest 1.5 TTL: gone by the old TTL
        queue = make_queue(client, "ha", "k", 1)  # the next run: a TTL of 24 old ones
        await set_dupefilter(queue, MemoryConfig(dupefilter="set"), TTL * 24)
        assert await queue.enqueue(entries(range(1))) == 1  # its worker's first request
        assert await fingerprints(redis_url) == 2  # (it said 0)
        checked = await cli(redis_url, "seen", "check", "k", url)
        assert checked.returncode == 0 and ": seen (in the time slice" in checked.stdout, (
            checked.stdout
        )
        pushed = await cli(redis_url, "push", "k", url)  # what the crawl does with a link
        assert "0 added, 1 filtered" in pushed.stdout, pushed.stdout
    finally:
        await client.aclose()


@deferred_f_from_coro_f
async def test_the_bloom_slices_count_by_a_ttl_raised_by_the_next_run(redis_url: str) -> None:
    """The same with a Bloom filter in time slices: status counted 0 of its 2 URLs."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        config = MemoryConfig(dupefilter="bloom", capacity=1000)
        queue = await sliced(client, config)
        assert await queue.enqueue(entries(range(1))) == 1
        await age_every_slot(client, TTL * 1.5, KEYS.bloom)
        queue = make_queue(client, "ha", "k", 1)
        await set_dupefilter(queue, config, TTL * 24)
        assert await queue.enqueue(entries(range(1, 2))) == 1
        assert await fingerprints(redis_url) == 2  # (it said 0)
    finally:
        await client.aclose()
