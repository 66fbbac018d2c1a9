"""The crawl's dupefilter kind, claimed by its first worker (``ha:{S}:filter``): workers of
two kinds that start an empty crawl together are not both let in (the checks at start read
what is stored, and an empty crawl stores nothing until a worker's first round); the claim
is crawl-wide over the shards, and it goes exactly when the dupefilter goes (a finish that
clears, a flush), so the next run may choose another kind. Real redis-server, real crawls."""

from __future__ import annotations

import asyncio
import functools
import re
from datetime import datetime
from typing import TYPE_CHECKING

import pytest
import redis
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.config.memory import MemoryConfig
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.store.claims import claimed_kind
from scrapy_ha.store.finish import complete_finish
from scrapy_ha.store.sharding import check_shard_count, make_queue, set_dupefilter
from tests.dupefilter import BLOOM
from tests.scrapy_project import write_project
from tests.spiders import CatalogueSpider
from tests.test_cli import scrapy_ha
from tests.test_finish import Hooked
from tests.test_redis_failover import crawl_settings

if TYPE_CHECKING:
    from pathlib import Path

    from tests.conftest import Site

#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")

SET = {"HA_DUPEFILTER": "set"}
BLOOM_MEMORY = MemoryConfig(dupefilter="bloom")


async def register(client: redis.asyncio.Redis, shards: int, worker: str) -> None:
    """*worker* registered as join.lua registers it: a heartbeat of an unsharded crawl, a
    join of a sharded one (for a minute)."""
    seconds, _ = await client.time()
    where = "ha:{k}:workers" if shards == 1 else "ha:{k}:joins"
    await client.zadd(where, {worker: (seconds + 60) * 1000})


@pytest.mark.parametrize("shards", [1, 3])
@deferred_f_from_coro_f
async def test_two_kinds_starting_an_empty_crawl_together_are_not_both_let_in(
    redis_url: str, shards: int
) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        exact, bloom = (make_queue(client, "ha", "k", shards) for _ in range(2))
        await register(client, shards, "w1")  # a worker registers (join.lua), then claims
        await set_dupefilter(exact, MemoryConfig(), worker="w1")  # both find the crawl empty
        with pytest.raises(ConfigError) as refused:
            await set_dupefilter(bloom, MemoryConfig(dupefilter="bloom"), worker="w2")
        assert str(refused.value) == (
            "HA_DUPEFILTER='bloom' but the crawl of k in Redis has a dupefilter of another kind, "
            "HA_DUPEFILTER='set' (key ha:{k}:filter, set by the first worker): run every worker "
            "of the crawl with the same, or `scrapy-ha flush k` first to start it again"
        )
        with pytest.raises(ConfigError, match="TTL=60 but .*HA_DUPEFILTER='set' \\(key"):
            await set_dupefilter(bloom, MemoryConfig(), ttl=60.0, worker="w2")
        await set_dupefilter(make_queue(client, "ha", "k", shards), MemoryConfig())  # the same kind
        assert await client.get("ha:{k}:filter") == b"set"
        await exact.flush()
        assert not await client.exists("ha:{k}:filter")
        await set_dupefilter(bloom, MemoryConfig(dupefilter="bloom"), ttl=60.0)  # a new crawl
        assert await client.get("ha:{k}:filter") == b"bloom sliced 60"
        await bloom.flush()
    finally:
        await client.aclose()


@pytest.mark.parametrize("shards", [1, 3])
@deferred_f_from_coro_f
async def test_a_worker_of_another_ttl_is_refused_while_the_crawl_runs(
    redis_url: str, shards: int
) -> None:
    """Workers of two HA_DUPEFILTER_TTL would each drop the time slices the other keeps (the
    shortest TTL wins for every worker, at once): the second is refused at start, naming
    both; once no other worker is alive, a worker of a new TTL takes the crawl over; an
    earlier version's claim, which names no TTL, takes any."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await register(client, shards, "w1")
        await set_dupefilter(
            make_queue(client, "ha", "k", shards), MemoryConfig(), 3600, worker="w1"
        )
        assert await client.get("ha:{k}:filter") == b"set sliced 3600"
        with pytest.raises(ConfigError) as refused:
            await set_dupefilter(
                make_queue(client, "ha", "k", shards), MemoryConfig(), 1, worker="w2"
            )
        assert str(refused.value).startswith(
            "HA_DUPEFILTER='set' with HA_DUPEFILTER_TTL=1 but the crawl of k in Redis has a "
            "dupefilter of another kind, HA_DUPEFILTER='set' with HA_DUPEFILTER_TTL=3600 "
        )
        await set_dupefilter(
            make_queue(client, "ha", "k", shards), MemoryConfig(), 3600, worker="w3"
        )
        await client.set("ha:{k}:filter", "set sliced")  # an earlier version's claim
        await set_dupefilter(make_queue(client, "ha", "k", shards), MemoryConfig(), 1, worker="w4")
        await client.delete("ha:{k}:workers", "ha:{k}:joins")  # every other worker gone
        await client.set("ha:{k}:filter", "set sliced 3600")
        await set_dupefilter(make_queue(client, "ha", "k", shards), MemoryConfig(), 1, worker="w5")
        assert await client.get("ha:{k}:filter") == b"set sliced 1"
    finally:
        await client.flushdb()
        await client.aclose()


@deferred_f_from_coro_f
async def test_ttls_that_differ_past_6_digits_are_two_kinds(redis_url: str) -> None:
    """Before: the claim kept the TTL to 6 significant digits: workers of 1234567 and
    1234568 both claimed ``set sliced 1.23457e+06`` and were let in together, and tools
    read 1234570. Now it is kept exactly; a claim of an earlier version still takes a
    worker of its TTL."""
    client = redis.asyncio.Redis.from_url(redis_url)
    queue = functools.partial(make_queue, client, "ha", "k", 1)
    try:
        await register(client, 1, "w1")
        await set_dupefilter(queue(), MemoryConfig(), 1234567.0, worker="w1")
        assert await client.get("ha:{k}:filter") == b"set sliced 1234567"
        assert await claimed_kind(queue()) == ("set", 1234567.0)
        with pytest.raises(ConfigError, match=r"TTL=1234568 but .* HA_DUPEFILTER_TTL=1234567 "):
            await set_dupefilter(queue(), MemoryConfig(), 1234568.0, worker="w2")
        await client.set("ha:{k}:filter", "set sliced 1.23457e+06")  # an earlier version's
        await set_dupefilter(queue(), MemoryConfig(), 1234567.0, worker="w3")  # its TTL
        with pytest.raises(ConfigError, match=r"TTL=7654321 but .*TTL=1\.23457e\+06 "):
            await set_dupefilter(queue(), MemoryConfig(), 7654321.0, worker="w4")
        await client.delete("ha:{k}:filter")
        await set_dupefilter(queue(), MemoryConfig(), 1234567.25, worker="w1")
        assert await client.get("ha:{k}:filter") == b"set sliced 1234567.25"
        assert await claimed_kind(queue()) == ("set", 1234567.25)
    finally:
        await client.flushdb()
        await client.aclose()


@pytest.mark.parametrize("shards", [1, 3])
@deferred_f_from_coro_f
async def test_a_claim_no_live_worker_made_gives_way(redis_url: str, shards: int) -> None:
    """A claim outlives its crawl when an earlier version's finish or flush (which knows no
    claim) clears the crawl: with no worker alive but this one and nothing stored, the
    crawl is empty, and this worker's kind becomes the crawl's."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await client.set("ha:{k}:filter", "set")  # left by such a finish
        await register(client, shards, "w2")  # this worker itself: not another
        await set_dupefilter(make_queue(client, "ha", "k", shards), BLOOM_MEMORY, worker="w2")
        assert await client.get("ha:{k}:filter") == b"bloom"
        await register(client, shards, "w3")  # alive, and maybe about to write its bloom
        with pytest.raises(ConfigError, match="'set' but .*HA_DUPEFILTER='bloom' \\(key"):
            await set_dupefilter(make_queue(client, "ha", "k", shards), MemoryConfig(), worker="w4")
    finally:
        await client.aclose()


@pytest.mark.parametrize("shards", [1, 3])
@deferred_f_from_coro_f
async def test_the_claim_goes_with_the_dupefilter_at_a_finish(
    redis_url: str, site: Site, shards: int
) -> None:
    client = redis.Redis.from_url(redis_url)
    kept = crawl_settings(redis_url, SCHEDULER_PERSIST=True, HA_SHARDS=shards, **BLOOM)
    await get_crawler(CatalogueSpider, kept).crawl_async(base_url=site.url)
    assert client.get("ha:{catalogue}:filter") == b"bloom"  # kept with the filter it names
    cleared = crawl_settings(redis_url, HA_SHARDS=shards, **BLOOM)
    await get_crawler(CatalogueSpider, cleared).crawl_async(base_url=site.url)
    assert not client.exists("ha:{catalogue}:filter")  # cleared with the filter
    exact = get_crawler(CatalogueSpider, crawl_settings(redis_url, HA_SHARDS=shards, **SET))
    await exact.crawl_async(base_url=site.url)  # the next run chooses the exact set
    assert len(exact.spider.items) == 50
    assert not client.exists("ha:{catalogue}:filter")
    client.close()


@deferred_f_from_coro_f
async def test_a_push_claims_the_kind_only_when_it_pushes(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        bad = await asyncio.to_thread(
            scrapy_ha, "--redis-url", redis_url, "push", "k", "--create", "ftp://a.example/x"
        )
        assert bad.returncode == 1 and not client.exists("ha:{k}:filter")  # nothing pushed
        good = await asyncio.to_thread(
            scrapy_ha, "--redis-url", redis_url, "push", "k", "--create", "https://a.example/x"
        )
        assert good.returncode == 0, good.stderr
        assert client.get("ha:{k}:filter") == b"set"  # scrapy-ha's default, as a worker's
    finally:
        client.close()


@deferred_f_from_coro_f
async def test_a_sharded_finish_overtaken_by_a_join_leaves_the_new_claim(redis_url: str) -> None:
    """The finish's worker was slow: past its deadline a joining worker completed the
    finish, joined and claimed its kind. The slow finish, done with its last shard, must
    not delete that new claim (it checks its record first, as before each shard)."""
    client = Hooked.from_url(redis_url)
    plain = redis.asyncio.Redis.from_url(redis_url)
    seen = {"last": False}

    async def overtaken(args: tuple) -> None:
        if seen["last"]:  # the first command after the last shard was cleared
            seen["last"] = False
            await plain.set("ha:{c}:finish", "done")  # completed by the joiner...
            await plain.set("ha:{c}:filter", "bloom")  # ...which then claimed its kind
        if args[0] == "DEL" and "ha:{c:1}:workers" in args:
            seen["last"] = True

    try:
        queue = make_queue(client, "ha", "c", 2)
        await plain.set("ha:{c}:finish", "commit T 99999999999999")
        await plain.set("ha:{c}:filter", "set")
        client.hook = overtaken
        assert not await complete_finish(queue, "T")  # the record moved on
        assert await plain.get("ha:{c}:filter") == b"bloom"
    finally:
        await client.aclose()
        await plain.aclose()


@pytest.mark.parametrize(("shards", "ttl"), [(4, 0.0), (1, 3600.0)])
@deferred_f_from_coro_f
async def test_a_push_from_outside_the_project_takes_the_kind_the_crawl_claimed(
    redis_url: str, tmp_path: Path, shards: int, ttl: float
) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    queue = make_queue(client, "ha", "k", shards)
    await check_shard_count(queue)
    await set_dupefilter(queue, BLOOM_MEMORY, ttl)  # claims "bloom" or "bloom sliced 3600"
    await seed_filter(redis_url, tmp_path, shards, ttl)  # the filter's layout: the workers'
    push = ("--redis-url", redis_url, "push", "k", "--create")  # no project: "set" by default
    first = await asyncio.to_thread(scrapy_ha, *push, "https://a.example/x", "https://b.example/")
    assert first.returncode == 0, first.stderr
    assert "2 added, 0 filtered" in first.stdout, first.stdout
    again = await asyncio.to_thread(scrapy_ha, *push, "https://a.example/x")
    assert again.returncode == 0 and "0 added, 1 filtered" in again.stdout  # by the Bloom filter
    blooms = [f"ha:{{k:{i}}}:bloom" for i in range(shards)] if shards > 1 else ["ha:{k}:bloom"]
    assert any([await client.exists(b) for b in blooms])
    assert not await client.exists("ha:{k}:dupefilter") and not await client.keys("*:seen:*")
    # an earlier version's crawl, without a claim: the settings decide, and a refusal says
    # how to fix it from the command line, never `flush` (it would delete the crawl)
    await client.delete("ha:{k}:filter")
    refused = await asyncio.to_thread(scrapy_ha, *push, "https://c.example/")
    assert refused.returncode == 2 and "run the command in the crawl's Scrapy project" in (
        refused.stderr
    )
    assert "flush" not in refused.stderr
    await client.aclose()


@pytest.mark.parametrize(("kind", "shards"), [("set", 1), ("set", 3), ("bloom", 1), ("bloom", 3)])
@deferred_f_from_coro_f
async def test_seen_check_from_outside_the_project_shows_the_ttl_the_crawl_claimed(
    redis_url: str, tmp_path: Path, kind: str, shards: int
) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    queue = make_queue(client, "ha", "k", shards)
    await check_shard_count(queue)
    await set_dupefilter(queue, MemoryConfig(dupefilter=kind), 3600)  # "<kind> sliced 3600"
    if kind == "bloom":
        await seed_filter(redis_url, tmp_path, shards, 3600)
    url = "https://a.example/x"
    push = ("--redis-url", redis_url, "push", "k", "--create", url)
    pushed = await asyncio.to_thread(scrapy_ha, *push)
    assert pushed.returncode == 0 and "1 added" in pushed.stdout, pushed.stderr
    # no project here: HA_DUPEFILTER_TTL is 0 by the settings, 3600 by the crawl's claim
    check = ("--redis-url", redis_url, "seen", "check", "k", url)
    checked = await asyncio.to_thread(scrapy_ha, *check)
    assert checked.returncode == 0, checked.stderr
    line = checked.stdout.strip()
    assert line.startswith(f"{url}: seen (in the time slice started "), line
    assert "; new again by " in line, line  # a TTL after it was seen, not "kept for ever"
    # the slice is dropped once its newest URL is a TTL old: a slice (TTL / 8) after its start
    stamps = re.findall(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", line)
    start, new_at = (datetime.strptime(t, "%Y-%m-%d %H:%M:%S") for t in stamps)
    assert (new_at - start).total_seconds() == 3600 * (1 + 1 / 8), line
    await client.aclose()


#: A project whose workers keep a Bloom filter: they fingerprint by 16 bytes, not 12.
BLOOM_PROJECT = 'import scrapy\n\n\nclass K(scrapy.Spider):\n    name = "k"\n'


def bloom_project(tmp_path: Path, shards: int = 1, ttl: float = 0.0) -> Path:
    """A project of spider k whose workers keep a Bloom filter (of *shards*, *ttl*)."""
    setting = (
        f"HA_DUPEFILTER = 'bloom'\nHA_DUPEFILTER_TTL = {ttl}\nHA_SHARDS = {shards}\n"
        "HA_DUPEFILTER_CAPACITY = 1000\n"
    )
    return write_project(tmp_path / "project", "bloomproj", BLOOM_PROJECT, setting)


async def seed_filter(redis_url: str, tmp_path: Path, shards: int, ttl: float) -> None:
    """A Bloom filter in one shard of crawl k, made as its workers make it (a shard's with
    its first URL): a push from outside the project takes its layout from it, and refuses
    to guess one before any shard has a filter (tests/test_push_bloom_layout.py)."""
    push = ("--redis-url", redis_url, "push", "k", "--create", "https://seed.example/")
    seeded = await asyncio.to_thread(scrapy_ha, *push, cwd=bloom_project(tmp_path, shards, ttl))
    assert seeded.returncode == 0 and "1 added" in seeded.stdout, seeded.stderr


@pytest.mark.parametrize("ttl", [0.0, 3600.0])
@deferred_f_from_coro_f
async def test_a_push_from_outside_the_project_fingerprints_as_the_bloom_crawl_s_workers(
    redis_url: str, tmp_path: Path, ttl: float
) -> None:
    project = bloom_project(tmp_path, ttl=ttl)
    client = redis.asyncio.Redis.from_url(redis_url)
    await set_dupefilter(make_queue(client, "ha", "k", 1), BLOOM_MEMORY, ttl)
    push = ("--redis-url", redis_url, "push", "k", "--create", "https://a.example/x")
    inside = await asyncio.to_thread(scrapy_ha, *push, cwd=project)  # as a worker has it
    assert inside.returncode == 0 and "1 added" in inside.stdout, inside.stderr
    outside = await asyncio.to_thread(scrapy_ha, *push)  # no project: "set" by the settings
    assert outside.returncode == 0, outside.stderr
    assert "0 added, 1 filtered" in outside.stdout, outside.stdout  # the same URL, seen
    await client.aclose()


@deferred_f_from_coro_f
async def test_seen_forget_refuses_a_sharded_bloom_filter_whose_shard_0_is_empty(
    redis_url: str, tmp_path: Path
) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    queue = make_queue(client, "ha", "k", 3)
    await check_shard_count(queue)
    await set_dupefilter(queue, BLOOM_MEMORY)  # a shard gets its filter with its first URL
    url = "https://a.example/x"  # placed in shard 1 (not 0) by its fingerprint
    push = ("--redis-url", redis_url, "push", "k", "--create", url)
    pushed = await asyncio.to_thread(scrapy_ha, *push, cwd=bloom_project(tmp_path, 3))
    assert pushed.returncode == 0, pushed.stderr
    assert not await client.exists("ha:{k:0}:bloom") and await client.exists("ha:{k:1}:bloom")
    forget = ("--redis-url", redis_url, "seen", "forget", "k", url, "--yes")
    refused = await asyncio.to_thread(scrapy_ha, *forget)
    assert refused.returncode == 2, refused.stdout
    assert "k has a Bloom filter for a dupefilter: a Bloom filter cannot take" in refused.stderr
    check = ("--redis-url", redis_url, "seen", "check", "k", url)
    kept = await asyncio.to_thread(scrapy_ha, *check)  # kept for ever: not read URL by URL
    assert kept.returncode == 2 and "nothing to check" in kept.stderr, kept.stdout
    await client.aclose()


@deferred_f_from_coro_f
async def test_a_worker_refused_at_start_is_no_live_worker(redis_url: str, site: Site) -> None:
    """A QA finding: the refused worker stayed registered until its heartbeat expired, and
    kept `scrapy-ha flush` (which its refusal names as the fix) from running: "1 worker(s)
    of k are alive"."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await register(client, 1, "w1")
        await set_dupefilter(make_queue(client, "ha", "k", 1), BLOOM_MEMORY, worker="w1")
        settings = {**crawl_settings(redis_url), **SET, "HA_WORKER_ID": "refused"}

        class K(CatalogueSpider):
            name = "k"

        crawler = get_crawler(K, settings)
        await crawler.crawl_async(base_url=site.url)
        assert crawler.stats.get_value("finish_reason") == "ha_start_failed"
        workers = await client.zrange("ha:{k}:workers", 0, -1)
        assert workers == [b"w1"], workers  # (before: w1 and the refused worker)
    finally:
        await client.aclose()
