"""Entries a script sets aside as corrupt (a pending request without an entry id, a leased
entry without a readable lease record) are archived (HA_DLQ_ARCHIVE_URL) and alerted for
(HA_DLQ_ALERT_WEBHOOK) as every other dead letter. Real crawls, a real redis-server, SQLite
and a real PostgreSQL, a real local webhook receiver."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.keys import Keys
from scrapy_ha.store.shard_sync import outside
from tests.spiders import FaultSpider
from tests.test_alerts import Receiver
from tests.test_archive import rows
from tests.test_retry_crawl import FAST_RETRIES

if TYPE_CHECKING:
    from collections.abc import Iterator

KEYS = Keys("ha", "faults")


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def corrupt_the_queue(redis_client, keys: Keys = KEYS) -> None:
    """A pending request without an entry id (sync.lua sets it aside when it comes up for a
    lease) and an expired lease without a lease record (reclaim.lua sets it aside)."""
    redis_client.rpush(keys.queue("0:-"), b" no entry id")
    redis_client.zadd(keys.ready, {"0:-": 0})
    redis_client.zadd(keys.leased, {b"9001": 0})
    redis_client.hset(keys.payload, b"9001", b"unreadable")


@pytest.mark.parametrize("shards", [1, 3])
@deferred_f_from_coro_f
async def test_entries_set_aside_by_scripts_are_archived_and_alerted(
    redis_url, redis_client, site, archive_url, receiver, shards
):
    """Sharded (in shard 2): they were looked for in shard 0's dead letters alone."""
    keys = KEYS if shards == 1 else Keys("ha", "faults", 2, shards)
    corrupt_the_queue(redis_client, keys)
    settings = {
        **FAST_RETRIES,
        "REDIS_URL": redis_url,
        "HA_DLQ_ARCHIVE_URL": archive_url,
        "HA_DLQ_ALERT_WEBHOOK": receiver.url,
        "HA_DLQ_ALERT_THRESHOLD": 2,
        "HA_SHARDS": shards,
    }
    crawler = get_crawler(FaultSpider, settings)
    await crawler.crawl_async(base_url=site.url, paths=("/item/1",))
    assert crawler.stats.get_value("item_scraped_count") == 1
    assert crawler.stats.get_value("ha/dead/corrupt") == 2
    named = "" if shards == 1 else "2:"  # (as dlq list names them)
    dead = {named + i.decode() for i in redis_client.zrange(keys.dead, 0, -1)}
    assert len(dead) == 2
    found = rows(archive_url)
    assert set(found) == dead
    assert {r["failure_class"] for r in found.values()} == {"corrupt"}
    assert crawler.stats.get_value("ha/archive/archived") == 2
    (post,) = receiver.posts
    assert post["spider"] == "faults" and post["dead"] == 2


@deferred_f_from_coro_f
async def test_entries_set_aside_in_several_shards_of_one_round_are_all_archived(
    redis_url, redis_client, site, archive_url, receiver
):
    """A sharded round's reply had the time of its last shard's call alone: the entries an
    earlier shard's call set aside (its own time, a millisecond before) were not found, so
    not archived by the worker, nor alerted for."""
    shards = 6
    every = Keys("ha", "faults", 0, shards).every_shard()
    for keys in every:
        corrupt_the_queue(redis_client, keys)
    settings = {
        **FAST_RETRIES,
        "REDIS_URL": redis_url,
        "HA_DLQ_ARCHIVE_URL": archive_url,
        "HA_DLQ_ALERT_WEBHOOK": receiver.url,
        "HA_DLQ_ALERT_THRESHOLD": 2 * shards,
        "HA_SHARDS": shards,
    }
    crawler = get_crawler(FaultSpider, settings)
    await crawler.crawl_async(base_url=site.url, paths=("/item/1",))
    assert crawler.stats.get_value("ha/dead/corrupt") == 2 * shards
    dead = {
        outside(shard, i.decode())
        for shard, keys in enumerate(every)
        for i in redis_client.zrange(keys.dead, 0, -1)
    }
    assert len(dead) == 2 * shards
    assert set(rows(archive_url)) == dead
    assert crawler.stats.get_value("ha/archive/archived") == 2 * shards
    (post,) = receiver.posts
    assert post["dead"] == 2 * shards
