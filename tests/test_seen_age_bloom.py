"""Seen with an age and a Bloom filter: HA_DUPEFILTER = "bloom" with HA_DUPEFILTER_TTL
(lua/lib/aged.lua: time slices of Bloom filters, dropped whole) against a real Redis, and in
crawls: a URL seen longer ago than the TTL is new again, one seen within it is filtered, a
request's ha_recrawl_after is honoured, memory stays that of the live slices however many
TTLs pass, the error the crawl reports is the one it runs at, and a crawl kept for ever
cannot switch."""

from __future__ import annotations

import asyncio
import hashlib
import time

import pytest
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.config.memory import MemoryConfig
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.keys import SEEN_SLICES, Keys
from scrapy_ha.store.aged import AgedBloom, slice_capacity, slices_where
from scrapy_ha.store.bloom import (
    BloomFilter,
    DupefilterRefused,
    bloom_k,
    filter_keys,
)
from scrapy_ha.store.bloom_state import bloom_state
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.sharding import dupefilter_figures, set_dupefilter
from scrapy_ha.store.wire import NewEntry
from tests.cli_seed import scrapy_ha
from tests.spiders import CatalogueSpider
from tests.test_seen_age import ages_out, asks_a_shorter_age

KEYS = Keys("ha", "s")
TTL_MS = 2000  # slices of 250 ms
SLICE = TTL_MS / SEEN_SLICES / 1000

#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


def fingerprint(name: bytes) -> bytes:
    return hashlib.sha1(name).digest()[:16]


def queue(url: str, ttl_ms: int = TTL_MS, capacity: int = 1000, error: float = 1e-3):
    q = RedisQueue(redis.asyncio.Redis.from_url(url), KEYS)
    q.dupefilter = AgedBloom(capacity, error, ttl_ms)
    return q


def entry(name: bytes, age_ms: int = 0) -> NewEntry:
    payload = b'{"v":1,"u":"http://a.example/' + name + b'"}'
    return NewEntry(fingerprint(name), 0, payload, age_ms=age_ms)


async def added(q: RedisQueue, *entries: NewEntry) -> int:
    return await q.enqueue(list(entries))


async def meta(q: RedisQueue) -> dict[str, str]:
    raw = await q.client.hgetall(KEYS.bloom)
    return {k.decode(): v.decode() for k, v in raw.items()}


async def newest_start(q: RedisQueue) -> int:
    return max(int(v) for k, v in (await meta(q)).items() if k.startswith("s"))


async def server_ms(q: RedisQueue) -> int:
    seconds, micros = await q.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_each_slice_is_sized_so_that_a_check_of_every_slice_errs_the_rate_asked():
    slices = AgedBloom.for_crawl(10_000_000, 1e-6, 3_600_000)
    assert slices.capacity == slice_capacity(10_000_000) == 1_250_000  # a TTL/8 of URLs
    assert slices.k == bloom_k(1e-6 / (SEEN_SLICES + 1)) == 25
    # a slice errs at most 2^-(k-1); the 9 a check reads, together, at most the rate asked
    assert (SEEN_SLICES + 1) * 2.0 ** -(slices.k - 1) <= 1e-6
    assert slices.spec() == f"bloom-ttl 3600000 1250000 25 {slices.part} 1e-06"


@deferred_f_from_coro_f
async def test_a_url_seen_longer_ago_than_the_ttl_is_new_again(redis_url):
    await ages_out(queue(redis_url), entry)


@deferred_f_from_coro_f
async def test_a_request_asks_a_shorter_age_than_the_ttl(redis_url):
    await asks_a_shorter_age(queue(redis_url), entry)


@deferred_f_from_coro_f
async def test_slices_are_dropped_whole_and_memory_stays_that_of_the_live_ones(redis_url):
    """Over five TTLs of new URLs the filter keeps at most 9 slices: their bitmaps are
    dropped whole with their slot, so memory does not grow with the TTLs that passed."""
    q = queue(redis_url, ttl_ms=1000)  # slices of 125 ms
    client = q.client
    peak_keys, peak_bytes, n = 0, 0, 0
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        n += 1
        await added(q, *(entry(b"u%d.%d" % (n, i)) for i in range(20)))
        bitmaps = await filter_keys(client, KEYS)
        assert bitmaps == [k.decode() for k in sorted(await client.keys(f"{KEYS.bloom}:s*"))]
        sizes = [await client.memory_usage(k) or 0 for k in bitmaps]
        peak_keys, peak_bytes = max(peak_keys, len(bitmaps)), max(peak_bytes, sum(sizes))
        await asyncio.sleep(0.05)
    state = bloom_state(await client.hgetall(KEYS.bloom))
    assert state is not None and 1 <= state.slices <= SEEN_SLICES + 1
    assert peak_keys <= SEEN_SLICES + 1  # one layer of one part each: none grew
    one_slice = await client.memory_usage(bitmaps[0])
    assert peak_bytes <= (SEEN_SLICES + 1) * one_slice
    # the live slices hold the URLs of about the last 9/8 of a TTL, not of five TTLs
    assert state.urls == int((await meta(q))["n"]) < 20 * n / 3
    await client.aclose()


@deferred_f_from_coro_f
async def test_figures_skip_the_slices_a_check_no_longer_reads(redis_url):
    """Slices that ended a TTL ago are held until the next write drops them, but a check no
    longer reads them: the status and the stats do not count them meanwhile."""
    q = queue(redis_url)
    assert await added(q, entry(b"a"), entry(b"b")) == 2
    held = await q.client.hgetall(KEYS.bloom)
    state = bloom_state(held, await server_ms(q))
    assert state is not None and (state.slices, state.urls) == (1, 2)
    await asyncio.sleep((TTL_MS + TTL_MS / SEEN_SLICES) / 1000 + 0.1)  # no write since
    assert await q.client.hgetall(KEYS.bloom) == held  # still held
    state = bloom_state(held, await server_ms(q))
    assert state is not None and (state.slices, state.urls, state.error_now) == (0, 0, 0.0)
    figures = await dupefilter_figures(q)
    assert (figures["ha/dupefilter/urls"], figures["ha/dupefilter/error_rate"]) == (0, 0.0)
    assert await added(q, entry(b"a")) == 1  # as the check says: new again
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_the_error_the_crawl_reports_is_the_one_a_check_runs_at(redis_url):
    """Nine slices filled to their capacity: new URLs checked against every one of them are
    taken for seen at the rate the stats say (error_now), and under the rate asked."""
    rate = 0.05
    q = queue(redis_url, ttl_ms=8000, capacity=500, error=rate)  # slices of 1 s
    total = 0
    for s in range(SEEN_SLICES + 1):  # the ninth opens before the first ends a TTL ago
        for b in range(5):  # a few are taken for seen already (false positives): not added
            total += await added(q, *(entry(b"s%d.%d.%d" % (s, b, i)) for i in range(100)))
        if s < SEEN_SLICES:  # until the slot's end, by the server's clock
            await asyncio.sleep((await newest_start(q) + 1000 + 5 - await server_ms(q)) / 1000)
    state = bloom_state(await q.client.hgetall(KEYS.bloom))
    assert state is not None and state.slices == SEEN_SLICES + 1 and state.urls == total
    assert total > 4400
    probes = [fingerprint(b"new %d" % i) for i in range(10_000)]
    found = []
    for i in range(0, len(probes), 2000):
        found += await slices_where(q.client, KEYS, probes[i : i + 2000])
    measured = sum(1 for start in found if start) / len(probes)
    assert 0.6 * state.error_now <= measured <= 1.4 * state.error_now  # about 1.7 %
    assert state.error_now <= state.bound <= rate
    # the figures read the slices a check reads at their own time: on a busy machine the
    # first slice may have aged out by then (a TTL after its start), so compare them with the
    # state at the server's time just before and just after
    meta = await q.client.hgetall(KEYS.bloom)
    before = bloom_state(meta, await server_ms(q))
    figures = await dupefilter_figures(q)
    after = bloom_state(meta, await server_ms(q))
    assert before is not None and after is not None
    assert figures["ha/dupefilter/error_rate"] in (before.error_now, after.error_now)
    assert figures["ha/dupefilter/urls"] in (before.urls, after.urls)
    if after.slices == state.slices:  # no slice aged out: the figures are the state's
        assert figures["ha/dupefilter/error_rate"] == state.error_now
        assert figures["ha/dupefilter/urls"] == total
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_crawl_kept_for_ever_and_one_in_slices_do_not_switch(redis_url):
    """A Bloom filter cannot take out what it holds: a worker with HA_DUPEFILTER_TTL on a
    filter kept for ever, or without it on one in time slices, is refused at start, naming
    the settings and the fix."""
    config = MemoryConfig(dupefilter="bloom", capacity=1000, error_rate=1e-3)
    forever = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    forever.dupefilter = BloomFilter(1000, 1e-3)
    assert await added(forever, entry(b"a")) == 1
    with pytest.raises(ConfigError, match=r"HA_DUPEFILTER_TTL=60 but .* keeps its Bloom filter"):
        await set_dupefilter(forever, config, 60)
    await forever.flush()
    sliced = queue(redis_url)
    assert await added(sliced, entry(b"a")) == 1
    with pytest.raises(ConfigError, match=r"without HA_DUPEFILTER_TTL.*flush s"):
        await set_dupefilter(sliced, config, 0)
    await set_dupefilter(sliced, config, 3600)  # any TTL: the stored layout is kept
    assert sliced.dupefilter.spec().startswith("bloom-ttl 3600000 1000 ")  # as stored
    assert await added(sliced, entry(b"a")) == 0
    await sliced.flush()
    assert await sliced.client.keys(f"{KEYS.bloom}*") == []
    await forever.client.aclose()
    await sliced.client.aclose()


@deferred_f_from_coro_f
async def test_a_worker_without_the_ttl_does_not_join_slices_made_at_the_same_moment(
    redis_url,
):
    """Two workers start an empty crawl together, one with HA_DUPEFILTER_TTL and one
    without (neither saw a meta hash at start): the plain filter's script refuses the
    hash of time slices, naming the setting, and writes nothing, instead of keeping a
    second filter in it that knows none of the slices' URLs (every URL crawled twice)."""
    sliced = queue(redis_url)
    assert await added(sliced, entry(b"a")) == 1
    before = await meta(sliced)
    plain = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    plain.dupefilter = BloomFilter(1000, 1e-3)
    for name in (b"a", b"b"):
        with pytest.raises(DupefilterRefused, match=r"time slices \(HA_DUPEFILTER_TTL\)"):
            await added(plain, entry(name))
    assert await meta(sliced) == before
    assert sorted(await plain.client.keys(f"{KEYS.bloom}:0:*")) == []
    assert await added(sliced, entry(b"b")) == 1
    await sliced.client.aclose()
    await plain.client.aclose()


def settings(redis_url: str, **extra) -> dict:
    return {
        "ADDONS": {"scrapy_ha.Addon": 0},
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.3,
        "SCHEDULER_PERSIST": True,
        "HA_DUPEFILTER": "bloom",
        "HA_DUPEFILTER_TTL": 8,
        "LOG_LEVEL": "INFO",
        **extra,
    }


#: The TTLs the recrawl test tries in turn: two runs of the small crawl must fit in one.
TTLS = (8, 32, 128)
TTL = "HA_DUPEFILTER_TTL"


@pytest.mark.parametrize("shards", [1, 2])
@deferred_f_from_coro_f
async def test_a_persisted_crawl_recrawls_what_it_saw_longer_ago_than_the_ttl(
    redis_url, site, shards
):
    client = redis.asyncio.Redis.from_url(redis_url)
    for ttl in TTLS:  # the next TTL (on a fresh crawl) when a busy machine took longer
        crawlers = [
            get_crawler(CatalogueSpider, settings(redis_url, HA_SHARDS=shards, **{TTL: ttl}))
            for _ in range(3)
        ]
        start = time.monotonic()
        await crawlers[0].crawl_async(base_url=site.url)
        first_seen = time.monotonic()
        await crawlers[1].crawl_async(base_url=site.url)
        if time.monotonic() - start < ttl:  # the second run within the TTL of the first
            break
        await client.flushdb()
    else:
        pytest.fail(f"no two runs within {TTLS[-1]} s of each other")
    await asyncio.sleep(max(0.0, first_seen + ttl + ttl / 8 + 0.2 - time.monotonic()))
    await crawlers[2].crawl_async(base_url=site.url)  # past the TTL and its slice
    first, second, third = (sorted(i["id"] for i in c.spider.items) for c in crawlers)
    assert first and second == [] and third == first
    tags = ["catalogue"] if shards == 1 else [f"catalogue:{i}" for i in range(shards)]
    for tag in tags:  # every shard its own ring of slices
        assert await client.hexists(f"ha:{{{tag}}}:bloom", "period")
        assert await client.keys(f"ha:{{{tag}}}:bloom:s*")
    await client.aclose()


@deferred_f_from_coro_f
async def test_seen_check_reads_the_slices_and_forget_says_why_it_cannot(redis_url, site):
    crawler = get_crawler(CatalogueSpider, settings(redis_url, HA_DUPEFILTER_TTL=3600))
    await crawler.crawl_async(base_url=site.url)
    item = f"{site.url}/item/{crawler.spider.items[0]['id']}"
    checked = scrapy_ha(
        "seen", "check", "catalogue", item, f"{site.url}/nowhere", "--redis-url", redis_url
    )
    assert checked.returncode == 1, checked.stderr  # one of the two is not seen
    found, missing = checked.stdout.splitlines()
    assert found.startswith(f"{item}: seen (in the time slice started ")
    assert "or a false positive of its Bloom filter" in found
    assert missing == f"{site.url}/nowhere: not seen"
    status = scrapy_ha("status", "catalogue", "--redis-url", redis_url)
    assert status.returncode == 0, status.stderr
    assert "layer(s) of 1 time slice(s)" in status.stdout  # one slot: the crawl took < TTL/8
    stats = crawler.stats.get_stats()
    assert stats["ha/dupefilter/urls"] > len(crawler.spider.items)  # and the list pages
    assert 0 < stats["ha/dupefilter/error_rate"] < 1e-6
    refused = scrapy_ha("seen", "forget", "catalogue", item, "--yes", "--redis-url", redis_url)
    assert refused.returncode == 2
    assert "cannot take a URL out: give it as --pattern" in refused.stderr
    assert "new again by itself once its time slice is dropped" in refused.stderr


@pytest.mark.parametrize("kind", ["set", "bloom"])
def test_a_revisit_touches_the_fingerprint_the_worker_enqueued(kind):
    """A revisit keeps its URL seen under the fingerprint links to it are checked by: a
    Bloom filter's is longer (its positions read bytes 5-16)."""
    from scrapy import Request

    from scrapy_ha.config.scheduler import SchedulerConfig
    from scrapy_ha.scheduler.admission import Admission
    from scrapy_ha.scheduler.revisits import Revisits

    crawler = get_crawler(CatalogueSpider, {"HA_DUPEFILTER": kind, "HA_DUPEFILTER_TTL": 60})
    config = SchedulerConfig.from_settings(crawler.settings)
    request = Request("http://a.example/item/1")
    sent = Admission.from_config(crawler, config).fingerprint(request)
    assert Revisits.from_config(crawler, config).fingerprint(request) == sent
    assert len(sent) == (16 if kind == "bloom" else 12)
