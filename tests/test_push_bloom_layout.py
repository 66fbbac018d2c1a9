"""``scrapy-ha push`` outside the crawl's Scrapy project, on a crawl that keeps a Bloom
filter: a shard's filter the push makes is the one the workers would have made (the
layout of another shard's), never one of Scrapy's default settings (10 M URLs at 1e-6, a
64 MB filter the crawl would keep); with no filter to take it from, the push is refused.
Real redis-server, real ``scrapy-ha`` processes in and out of a real project."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest
import redis.asyncio
from scrapy import Request
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.request import fingerprint

from scrapy_ha.config.memory import MemoryConfig
from scrapy_ha.keys import shard_of
from scrapy_ha.store.sharding import check_shard_count, make_queue, set_dupefilter
from tests.scrapy_project import write_project
from tests.test_cli import scrapy_ha

if TYPE_CHECKING:
    from pathlib import Path

SHARDS = 3
#: The workers' filter: far smaller than the defaults' (10 M URLs at 1e-6).
PROJECT_SETTINGS = (
    "HA_DUPEFILTER = 'bloom'\nHA_DUPEFILTER_CAPACITY = 2000\n"
    "HA_DUPEFILTER_ERROR_RATE = 1e-3\nHA_SHARDS = {shards}\nHA_DUPEFILTER_TTL = {ttl}\n"
)
SPIDER = 'import scrapy\n\n\nclass K(scrapy.Spider):\n    name = "k"\n'
#: What a filter's meta hash holds of its layout, as made.
LAYOUT = ("capacity", "k", "part", "error")


def one_per_shard() -> list[str]:
    """A URL for each shard, in shard order (placed by a worker's fingerprint)."""
    found: dict[int, str] = {}
    for i in range(100):
        url = f"https://a.example/{i}"
        found.setdefault(shard_of(fingerprint(Request(url)), SHARDS), url)
    return [found[shard] for shard in range(SHARDS)]


async def made(client: redis.asyncio.Redis, shard: int) -> tuple[list[bytes], list[int]]:
    """The layout fields of a shard's filter and the sizes of its bitmaps."""
    meta = f"ha:{{k:{shard}}}:bloom"
    layout = await client.hmget(meta, LAYOUT)
    bitmaps = await client.keys(f"{meta}:*")
    return layout, sorted([await client.strlen(key) for key in bitmaps])


@pytest.mark.parametrize("ttl", [0, 3600])
@deferred_f_from_coro_f
async def test_a_push_from_outside_the_project_makes_a_shard_s_filter_as_the_workers_would(
    redis_url: str, tmp_path: Path, ttl: int
) -> None:
    settings = PROJECT_SETTINGS.format(shards=SHARDS, ttl=ttl)
    project = write_project(tmp_path / "project", "bloomproj", SPIDER, settings)
    first, outside, inside = one_per_shard()
    push = ("--redis-url", redis_url, "push", "k", "--create")
    seeded = await asyncio.to_thread(scrapy_ha, *push, first, cwd=project)  # shard 0's filter
    assert seeded.returncode == 0 and "1 added" in seeded.stdout, seeded.stderr
    pushed = await asyncio.to_thread(scrapy_ha, *push, outside)  # no project: defaults here
    assert pushed.returncode == 0 and "1 added" in pushed.stdout, pushed.stderr
    # (no worker's WARNING that its own settings, Scrapy's defaults here, "apply to a new
    # crawl": the push takes the crawl's filter, and no worker runs)
    assert "this worker's settings" not in pushed.stderr, pushed.stderr
    workers = await asyncio.to_thread(scrapy_ha, *push, inside, cwd=project)  # as a worker
    assert workers.returncode == 0 and "1 added" in workers.stdout, workers.stderr
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        layout, bitmaps = await made(client, 2)  # the project's settings made shard 2's
        assert layout[0] == (b"250" if ttl else b"2000"), layout  # a slice's: 2000 / 8 slices
        assert await made(client, 1) == (layout, bitmaps)  # the push's: byte for byte
        assert await made(client, 0) == (layout, bitmaps)
        assert max(bitmaps) < 2**16  # KB, not the defaults' 64 MB
    finally:
        await client.aclose()


@pytest.mark.parametrize("shards", [1, SHARDS])
@deferred_f_from_coro_f
async def test_a_push_from_outside_the_project_is_refused_before_any_bloom_filter_exists(
    redis_url: str, tmp_path: Path, shards: int
) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        queue = make_queue(client, "ha", "k", shards)
        await check_shard_count(queue)
        await set_dupefilter(queue, MemoryConfig(dupefilter="bloom"))  # claimed, no filter yet
        before = sorted(await client.keys("*"))
        push = ("--redis-url", redis_url, "push", "k", "--create", "https://a.example/x")
        refused = await asyncio.to_thread(scrapy_ha, *push)  # no project: the defaults here
        assert refused.returncode == 2, refused.stdout
        assert refused.stderr.startswith("error: the crawl of k keeps a Bloom filter"), (
            refused.stderr
        )
        assert "HA_DUPEFILTER_CAPACITY and HA_DUPEFILTER_ERROR_RATE" in refused.stderr
        assert "run push in the crawl's Scrapy project" in refused.stderr
        assert "start a worker of the crawl first" in refused.stderr
        assert sorted(await client.keys("*")) == before  # nothing written
        # the project's settings name the same kind: trusted as the workers'
        settings = PROJECT_SETTINGS.format(shards=shards, ttl=0)
        project = write_project(tmp_path / "project", "bloomproj", SPIDER, settings)
        pushed = await asyncio.to_thread(scrapy_ha, *push, cwd=project)
        assert pushed.returncode == 0 and "1 added" in pushed.stdout, pushed.stderr
        [meta] = await client.keys("*:bloom")
        assert await client.hget(meta, "capacity") == b"2000"
    finally:
        await client.aclose()
