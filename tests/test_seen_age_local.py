"""Seen with an age (``HA_DUPEFILTER_TTL``), a worker's own memory of the fingerprints it
sent (scheduler/seen.py), against a real Redis: a duplicate the crawl's dupefilter filtered
does not renew the URL's age, in Redis or in the worker that sent it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import redis.asyncio
from scrapy import Request
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.config.scheduler import SchedulerConfig
from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.admission import Admission
from scrapy_ha.scheduler.inflight import Kin
from scrapy_ha.store.aged import AgedSet
from scrapy_ha.store.queue import RedisQueue
from tests.spiders import CatalogueSpider

if TYPE_CHECKING:
    from collections.abc import Callable

KEYS = Keys("ha", "s")
TTL = 3600  # seconds: nothing ages by itself while the test runs


async def age_every_slot(client: redis.asyncio.Redis, seconds: float) -> None:
    """Move the start of every time slice *seconds* back, as if so long had passed."""
    for name, start in (await client.hgetall(KEYS.aged)).items():
        if name.startswith(b"s"):
            await client.hset(KEYS.aged, name, int(start) - int(seconds * 1000))


def later(seconds: float) -> Callable[[], float]:
    """A clock *seconds* ahead of the worker's."""
    return lambda: time.monotonic() + seconds


def two_workers(redis_url: str) -> tuple[Admission, Admission, RedisQueue]:
    """Two workers' admissions with a TTL, and the crawl's queue in time slices."""
    crawler = get_crawler(CatalogueSpider, {"HA_DUPEFILTER_TTL": TTL})
    config = SchedulerConfig.from_settings(crawler.settings)
    a, b = (Admission.from_config(crawler, config) for _ in range(2))
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    q.dupefilter = AgedSet(TTL * 1000)
    return a, b, q


@deferred_f_from_coro_f
async def test_a_duplicate_redis_filtered_is_new_again_for_its_worker_when_redis_says(
    redis_url: str,
) -> None:
    """A QA run, TTL 16 s: a URL first seen at 0 s was linked again on another worker at
    11 s (filtered in Redis, rightly), and that worker then dropped it itself at 19, 21, 23
    and 25 s, as sent by it at 11 s, while Redis took it as new from 18 s: it was crawled
    again at 28 s, not by 18 s as the reference says."""
    a, b, q = two_workers(redis_url)
    try:
        url = "http://a.example/listing"
        first = a.admit(Request(url), Kin(), None)
        assert first is not None and await q.enqueue([first]) == 1  # a sent it: seen
        duplicate = b.admit(Request(url), Kin(), None)  # b never sent it: asks Redis
        assert duplicate is not None
        result = await q.sync(enqueue=[duplicate])
        assert result.added == 0  # a duplicate, rightly
        b.forget_refused([duplicate], result)  # what b's round does with the reply
        await age_every_slot(q.client, 2 * TTL)  # a saw it longer ago than the TTL
        b.seen.clock = later(2 * TTL)  # and as long has passed for b
        again = b.admit(Request(url), Kin(), None)
        assert again is not None, "dropped by b, as if b had sent it when Redis filtered it"
        assert await q.enqueue([again]) == 1  # new again for the crawl
        assert b.admit(Request(url), Kin(), None) is None  # and seen by b from now on
    finally:
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_duplicate_redis_filtered_is_dropped_by_its_worker_for_a_slice_of_the_ttl(
    redis_url: str,
) -> None:
    """Redis does not say which of a batch it filtered: a worker that forgot the whole
    batch sent a link met on every page to Redis again on every page (a review: 400 pages
    sharing 20 links, 66 % more requests sent). Kept a slice of the TTL (TTL / 8), the
    precision of Redis's own slices, it goes to Redis once a slice."""
    a, b, q = two_workers(redis_url)
    try:
        nav = "http://a.example/nav"
        first = a.admit(Request(nav), Kin(), None)
        assert first is not None and await q.enqueue([first]) == 1
        batch = [b.admit(Request(u), Kin(), None) for u in (nav, "http://a.example/item/1")]
        assert all(batch)
        result = await q.sync(enqueue=batch)
        assert result.added == 1  # the nav link filtered, the item added
        b.forget_refused(batch, result)
        for page in range(3):  # the next pages link to it again: dropped by b itself
            assert b.admit(Request(nav), Kin(), None) is None, f"sent again on page {page}"
        b.seen.clock = later(TTL / 8 + 1)  # a slice later: Redis decides again
        assert b.admit(Request(nav), Kin(), None) is not None
    finally:
        await q.client.aclose()
