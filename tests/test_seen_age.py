"""Seen with an age: HA_DUPEFILTER_TTL and meta["ha_recrawl_after"] against a real Redis
(lua/lib/aged.lua: time slices dropped whole), and in crawls."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import replace
from typing import TYPE_CHECKING

import pytest
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.config.continuous import dupefilter_ttl
from scrapy_ha.config.memory import MemoryConfig
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.keys import SEEN_SLICES, Keys
from scrapy_ha.scheduler.outbox import Retained
from scrapy_ha.scheduler.seen import LocalSeen
from scrapy_ha.store.aged import AgedSet
from scrapy_ha.store.bloom import DupefilterRefused
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.sharding import set_dupefilter
from scrapy_ha.store.wire import NewEntry
from tests.spiders import CatalogueSpider

if TYPE_CHECKING:
    from collections.abc import Callable

KEYS = Keys("ha", "s")
TTL_MS = 2000  # slices of 250 ms


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


def queue(url: str, ttl_ms: int = TTL_MS) -> RedisQueue:
    q = RedisQueue(redis.asyncio.Redis.from_url(url), KEYS)
    if ttl_ms:
        q.dupefilter = AgedSet(ttl_ms)
    return q


def entry(fp: bytes, age_ms: int = 0) -> NewEntry:
    return NewEntry(fp, 0, b'{"v":1,"u":"http://a.example/' + fp + b'"}', age_ms=age_ms)


async def added(q: RedisQueue, *entries: NewEntry) -> int:
    return await q.enqueue(list(entries))


async def ages_out(q: RedisQueue, entry: Callable[..., NewEntry]) -> None:
    """A URL seen longer ago than the TTL (*q*'s, :data:`TTL_MS`) is new again, one seen
    within it is not: the exact set's slices and the Bloom filter's alike."""
    start = time.monotonic()
    assert await added(q, entry(b"a")) == 1
    assert await added(q, entry(b"a")) == 0
    await asyncio.sleep(1.0)
    assert await added(q, entry(b"a"), entry(b"b")) == 1  # a: seen 1 s ago, within 2 s
    ends = start + (TTL_MS + TTL_MS / SEEN_SLICES) / 1000 + 0.1  # the server's clock, later
    await asyncio.sleep(max(0.0, ends - time.monotonic()))
    assert await added(q, entry(b"a"), entry(b"b")) == 1  # a is new again; b is 1.25 s old
    assert await added(q, entry(b"a")) == 0  # and seen from now on
    await q.client.aclose()


async def asks_a_shorter_age(q: RedisQueue, entry: Callable[..., NewEntry]) -> None:
    """A request's own age (``ha_recrawl_after``) shorter than the TTL is honoured, a longer
    one is cut to the TTL."""
    assert await added(q, entry(b"a")) == 1
    await asyncio.sleep(0.8)  # past 500 ms and the slice it ended in (250 ms)
    assert await added(q, entry(b"a", age_ms=10 * TTL_MS)) == 0  # at most the TTL
    assert await added(q, entry(b"a", age_ms=500)) == 1
    assert await added(q, entry(b"a", age_ms=500)) == 0  # just seen again
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_url_seen_longer_ago_than_the_ttl_is_new_again(redis_url):
    await ages_out(queue(redis_url), entry)


@deferred_f_from_coro_f
async def test_a_request_asks_a_shorter_age_than_the_ttl(redis_url):
    await asks_a_shorter_age(queue(redis_url), entry)


@deferred_f_from_coro_f
async def test_slices_are_dropped_whole_and_stay_few(redis_url):
    q = queue(redis_url)
    for i in range(30):  # 3 s of new URLs: the ring holds 9 slots of 250 ms
        await added(q, entry(b"u%02d" % i))
        await asyncio.sleep(0.1)
    client = q.client
    live = [k for k in KEYS.aged_slices() if await client.exists(k)]
    assert 1 <= len(live) <= SEEN_SLICES + 1
    counts = await q.counts()
    assert 15 <= counts.fingerprints < 30  # the first second's URLs were dropped with their slots
    starts = await client.hgetall(KEYS.aged)
    assert len([f for f in starts if f.startswith(b"s")]) == len(live)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_the_set_kept_for_ever_counts_as_seen_when_a_ttl_is_set(redis_url):
    forever = queue(redis_url, ttl_ms=0)
    assert await added(forever, entry(b"old")) == 1
    assert (await forever.counts()).fingerprints == 1
    aged = queue(redis_url)
    assert await added(aged, entry(b"old"), entry(b"new")) == 1  # old: taken over, seen
    assert not await aged.client.exists(KEYS.dupefilter)
    assert (await aged.counts()).fingerprints == 2
    await asyncio.sleep((TTL_MS + TTL_MS / SEEN_SLICES) / 1000 + 0.1)
    assert await added(aged, entry(b"old")) == 1  # aged out from the switch on
    await forever.client.aclose()
    await aged.client.aclose()


@deferred_f_from_coro_f
async def test_a_crawl_in_slices_restarted_without_the_ttl_is_refused(redis_url):
    """A set crawl kept in time slices, started again without HA_DUPEFILTER_TTL, would get
    fresh buckets that know none of its URLs (every one crawled again): it is refused at
    start, naming the setting, the key and the fix, and the slices are left as they are."""
    aged = queue(redis_url)
    await set_dupefilter(aged, MemoryConfig(), TTL_MS / 1000)
    assert await added(aged, entry(b"a")) == 1
    again = queue(redis_url, ttl_ms=0)
    with pytest.raises(ConfigError, match=r"without HA_DUPEFILTER_TTL.*ha:\{s\}:aged.*flush s"):
        await set_dupefilter(again, MemoryConfig(), 0)
    assert await aged.client.exists(KEYS.aged)
    assert await added(aged, entry(b"a")) == 0  # the slices still hold it
    await aged.client.aclose()
    await again.client.aclose()


@pytest.mark.parametrize("first", ["ttl", "forever"])
@deferred_f_from_coro_f
async def test_workers_with_and_without_the_ttl_starting_together_keep_one_dupefilter(
    redis_url, first
):
    """A worker with HA_DUPEFILTER_TTL and one without start an empty crawl at once: both
    pass the check at start (nothing in Redis yet), then their first calls interleave.
    Whichever kind is written first is the crawl's; the other worker's sync is refused
    before any write, naming HA_DUPEFILTER_TTL and flush, instead of keeping a second
    dupefilter (time slices beside buckets) that knows none of the first one's URLs. (Two
    workers of this version are told apart at start, by the kind the first one claims:
    tests/test_seen_kind_claim.py; the second here claims none, as an earlier version.)"""
    sliced, plain = queue(redis_url), queue(redis_url, ttl_ms=0)
    await set_dupefilter(sliced, MemoryConfig(), TTL_MS / 1000)
    await sliced.client.delete(KEYS.filter_kind)  # no claim: a worker of an earlier version
    await set_dupefilter(plain, MemoryConfig(), 0)  # both started: neither kind is there
    winner, loser = (sliced, plain) if first == "ttl" else (plain, sliced)
    assert await added(winner, entry(b"a")) == 1
    before = sorted(await winner.client.keys("ha:{s}:*"))
    for name in (b"a", b"b"):
        with pytest.raises(DupefilterRefused, match=r"HA_DUPEFILTER_TTL.*flush"):
            await added(loser, entry(name))
    assert sorted(await winner.client.keys("ha:{s}:*")) == before  # the refusal wrote nothing
    assert await added(winner, entry(b"a"), entry(b"b")) == 1  # one dupefilter: a is seen
    await sliced.client.aclose()
    await plain.client.aclose()


@deferred_f_from_coro_f
async def test_setting_wrong_types_aside_keeps_the_time_slices(redis_url):
    """A key of the wrong type found in a round is set aside: the time slices' hash and
    sets are of the right type and stay (taken for bitmaps, they were renamed aside and
    every URL of the crawl was new again)."""
    aged = queue(redis_url)
    assert await added(aged, entry(b"a")) == 1
    await aged.client.set(KEYS.leases, "garbage")  # a key of the crawl written by hand
    assert await aged.set_aside_wrong_types() == [f"{KEYS.leases} (string, expected hash)"]
    assert await aged.client.exists(KEYS.aged, KEYS.aged_slices()[0]) == 2
    assert await added(aged, entry(b"a")) == 0
    await aged.client.aclose()


@deferred_f_from_coro_f
async def test_without_a_ttl_an_age_changes_nothing(redis_url):
    q = queue(redis_url, ttl_ms=0)
    assert await added(q, entry(b"a")) == 1
    await asyncio.sleep(0.2)
    assert await added(q, entry(b"a", age_ms=100)) == 0
    assert not await q.client.exists(KEYS.aged)
    await q.client.aclose()


def test_the_local_memory_of_a_worker_ages_as_redis_does(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    forever, aged = LocalSeen(), LocalSeen(ttl=60)
    for seen in (forever, aged):
        seen.remember(b"fp")
    now[0] += 30
    assert forever.seen(b"fp", None) and aged.seen(b"fp", None)
    assert not aged.seen(b"fp", 10)  # the request's own age
    now[0] += 31
    assert forever.seen(b"fp", None) and not aged.seen(b"fp", None)


@pytest.mark.parametrize(
    ("value", "expected"), [(None, 0.0), (0, 0.0), (3600, 3600.0), ("86400", 86400.0)]
)
def test_the_ttl_setting(value, expected):
    from scrapy.settings import Settings

    assert dupefilter_ttl(Settings({"HA_DUPEFILTER_TTL": value})) == expected


@pytest.mark.parametrize("value", [-1, 0.5, "x"])
def test_a_bad_ttl_names_the_setting(value):
    from scrapy.settings import Settings

    with pytest.raises(ConfigError, match="HA_DUPEFILTER_TTL"):
        dupefilter_ttl(Settings({"HA_DUPEFILTER_TTL": value}))


@pytest.mark.parametrize("value", [-1, "-1", 0.5])
def test_a_ttl_out_of_range_is_told_the_range(value):
    """A QA run: -1 said "must be 0 or more seconds" (0.5 is, and is refused all the same),
    where the reference quotes the range."""
    from scrapy.settings import Settings

    with pytest.raises(ConfigError, match=r"must be 0 \(seen for ever\) or 1 to 1e\+10 seconds"):
        dupefilter_ttl(Settings({"HA_DUPEFILTER_TTL": value}))


@pytest.mark.parametrize(
    ("value", "shown"),
    [(2e10, "20000000000.0"), (1e10 + 1, "10000000001.0"), ("inf", "'inf'"), ("nan", "'nan'")],
)
def test_a_ttl_past_the_claim_s_bound_is_refused_at_start(value, shown):
    """Before: a worker took 2e10 (its claim, ``set sliced 2e+10``, was then unreadable to
    ``push`` and ``seen check``, whose remedy is a flush) and inf (an OverflowError at
    start, a traceback). Now the setting is refused as the claim's TTL would be."""
    from scrapy.settings import Settings

    from scrapy_ha.config.scheduler import SchedulerConfig

    settings = Settings({"HA_DUPEFILTER_TTL": value})
    with pytest.raises(ConfigError, match=rf"^HA_DUPEFILTER_TTL={re.escape(shown)} (must|is not)"):
        SchedulerConfig.from_settings(settings)
    assert dupefilter_ttl(Settings({"HA_DUPEFILTER_TTL": 1e10})) == 1e10  # the bound itself


def test_a_ttl_is_taken_with_either_dupefilter():
    from scrapy.settings import Settings

    from scrapy_ha.config.scheduler import SchedulerConfig

    for kind in ("set", "bloom"):  # the Bloom filter in time slices: test_seen_age_bloom.py
        settings = Settings({"HA_DUPEFILTER_TTL": 3600, "HA_DUPEFILTER": kind})
        config = SchedulerConfig.from_settings(settings)
        assert (config.dupefilter_ttl, config.memory.dupefilter) == (3600, kind)


#: Seconds: two crawls of the site run within it, on a loaded machine too (8 s was not,
#: with a suite of 4 workers and other jobs on 2 cores: 10 s for the two).
TTL = 14


@deferred_f_from_coro_f
async def test_a_persisted_crawl_recrawls_what_it_saw_longer_ago_than_the_ttl(redis_url, site):
    settings = {
        "ADDONS": {"scrapy_ha.Addon": 0},
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.3,
        "SCHEDULER_PERSIST": True,
        "HA_DUPEFILTER_TTL": TTL,
        "LOG_LEVEL": "INFO",
    }
    crawlers = [get_crawler(CatalogueSpider, settings) for _ in range(3)]
    start = time.monotonic()
    await crawlers[0].crawl_async(base_url=site.url)
    first_seen = time.monotonic()
    await crawlers[1].crawl_async(base_url=site.url)
    assert time.monotonic() - start < TTL, "too slow: the second run was not within the TTL"
    # TTL + a slice
    await asyncio.sleep(max(0.0, first_seen + TTL + TTL / 8 + 0.2 - time.monotonic()))
    await crawlers[2].crawl_async(base_url=site.url)
    first, second, third = (sorted(i["id"] for i in c.spider.items) for c in crawlers)
    assert first and second == [] and third == first


@deferred_f_from_coro_f
async def test_a_child_stored_again_after_a_failover_keeps_its_age_and_host(redis_url):
    """A child a worker keeps for a failover is stored again as it was sent: with its
    ``ha_recrawl_after`` (else the crawl's TTL filters it on the server that lost it) and
    its host (else it goes to the back queue of no domain)."""
    q = queue(redis_url)
    assert await added(q, entry(b"a")) == 1  # seen: on the new primary too
    await asyncio.sleep(0.8)
    child = NewEntry(b"a", 0, entry(b"a").payload, ("p1", "tp"), age_ms=500, host="a.example")
    retained = Retained()
    retained.keep(1, [child])
    numbers, again = retained.lost(0, [("p1", "tp")])  # the server lost what it stored
    assert numbers == [1] and [(c.age_ms, c.host) for c in again] == [(500, "a.example")]
    assert await added(q, *[replace(c, parent=None) for c in again]) == 1
    await q.client.aclose()


@pytest.mark.parametrize("recrawl_after", [0, 0.0004])
@deferred_f_from_coro_f
async def test_a_request_new_again_at_once_is_new_again_with_the_next_slice(
    redis_url, recrawl_after
):
    """``meta["ha_recrawl_after"] = 0`` (or under a millisecond) is new again once the time
    slice that saw it is not the newest (TTL/8): it was sent as no age, and the whole TTL
    applied."""
    from scrapy import Request

    from scrapy_ha.config.scheduler import SchedulerConfig
    from scrapy_ha.scheduler.admission import Admission
    from scrapy_ha.scheduler.inflight import Kin

    crawler = get_crawler(CatalogueSpider, {"HA_DUPEFILTER_TTL": TTL_MS / 1000})
    admission = Admission.from_config(crawler, SchedulerConfig.from_settings(crawler.settings))
    q = queue(redis_url)
    url = "http://a.example/listing"
    first = admission.admit(Request(url), Kin(), None)
    assert first is not None and await added(q, first) == 1
    await asyncio.sleep(TTL_MS / 8 / 1000 + 0.05)  # the next slice
    again = admission.admit(Request(url, meta={"ha_recrawl_after": recrawl_after}), Kin(), None)
    assert again is not None and await added(q, again) == 1
    await q.client.flushdb()
    await q.client.aclose()
