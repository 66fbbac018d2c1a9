"""Which series ``scrapy-ha metrics`` exposes before anything happened: Prometheus's
``increase()`` and ``rate()`` count nothing of a series' first sample, so a series that is
born at its first non-zero value hides that value from every alert and panel built on them.
The real command, scraped over HTTP, against a crawl made through the queue's API."""

from __future__ import annotations

import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry
from scrapy_ha.verdict import RETRY_CLASSES
from tests.test_metrics import DEAD_LETTERED, exporter_factory, value  # noqa: F401 (a fixture)

#: Pages of one list that are all gone at once: more than ScrapyHADeadLettersGrowing's 10.
BURST = 12


async def _dead_letter_a_burst(queue: RedisQueue, fclass: str) -> None:
    entries = [NewEntry(b"fp%d" % i, 0, b"request %d" % i) for i in range(BURST)]
    assert await queue.enqueue(entries) == BURST
    for lease in await queue.lease(BURST, 600_000):
        assert await queue.dead_letter(lease.id, lease.token, {"class": fclass, "reason": "404"})


@deferred_f_from_coro_f
async def test_a_class_of_failure_is_exposed_at_0_before_its_first_dead_letter(
    redis_url,
    exporter_factory,  # noqa: F811
):
    """A running crawl, then 45 pages gone within one scrape interval (a real crawl, 3
    workers, Prometheus scraping every 2 s): ``scrapy_ha_dead_lettered_total{class="gone"}``
    appeared at 43, ``increase()`` counted 2.2, and ScrapyHADeadLettersGrowing (more than
    10 in 15 minutes) never fired."""
    queue = RedisQueue(redis.asyncio.Redis.from_url(redis_url), Keys("ha", "burst"))
    try:
        assert await queue.enqueue([NewEntry(b"home", 0, b"the home page")]) == 1
        exporter = exporter_factory(redis_url)
        before = exporter.scrape()
        assert value(before, "scrapy_ha_requests", spider="burst", state="pending") == 1
        for fclass in RETRY_CLASSES:  # what a scrape before any failure gives Prometheus
            assert value(before, DEAD_LETTERED, spider="burst", **{"class": fclass}) == 0
            labels = {"class": fclass}
            assert value(before, "scrapy_ha_retried_total", spider="burst", **labels) == 0
        assert value(before, DEAD_LETTERED, spider="burst", **{"class": "poison"}) == 0

        await _dead_letter_a_burst(queue, "gone")
        after = exporter.scrape()
        # what increase() over the two scrapes counts: every dead letter of the burst
        gone = {"class": "gone"}
        counted = value(after, DEAD_LETTERED, spider="burst", **gone) - value(
            before, DEAD_LETTERED, spider="burst", **gone
        )
        assert counted == BURST
        assert value(after, "scrapy_ha_requests", spider="burst", state="dead") == BURST
    finally:
        await queue.client.aclose()
