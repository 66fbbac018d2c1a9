"""The early report a hand-out asks for (on a real redis-server): it tells Redis only the
leases handed out since the last call, so a busy worker does not renew every held lease
several times a second (the full renewal stays at HA_LEASE_RENEW_INTERVAL)."""

from __future__ import annotations

import asyncio
import json
import time

import redis.asyncio
from scrapy import Request
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha import metakeys
from scrapy_ha.config.scheduler import SchedulerConfig
from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.shell import Scheduler
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry

KEYS = Keys("ha", "early")
#: The sync's lease length (ms); a renewal sets HA_LEASE_TIME (far longer), told apart.
SYNC_LEASE_MS = 30_000
LEASE_TIME = 600.0
#: Seconds to wait for the keeper's thread to reach Redis (a loaded machine).
DEADLINE = 20.0


def entry(name: str) -> NewEntry:
    return NewEntry(name.encode(), 0, f'{{"v":1,"u":"http://a.test/{name}"}}'.encode())


async def leased(q: RedisQueue, names: list[str]) -> dict[str, tuple[str, str]]:
    await q.sync(enqueue=[entry(name) for name in names])
    leases = (await q.sync(lease=len(names), lease_ms=SYNC_LEASE_MS, promote=10)).leases
    return {
        json.loads(lease.payload)["u"].rsplit("/", 1)[1]: (lease.id, lease.token)
        for lease in leases
    }


async def marked(q: RedisQueue, entry_id: str) -> bool:
    record = await q.client.hget(KEYS.leases, entry_id)
    return record is not None and record.endswith(b" h")


@deferred_f_from_coro_f
async def test_a_nudged_report_carries_only_the_newly_handed_lease(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    pairs = await leased(q, ["a", "b", "new"])
    crawler = get_crawler(settings_dict={"REDIS_URL": redis_url})
    crawler._apply_settings()
    config = SchedulerConfig(worker_id="w", lease_time=LEASE_TIME, renew_interval=LEASE_TIME / 2)
    s = Scheduler(crawler, config)
    s.session.queue = q
    for name in ("a", "b"):
        s.inflight.add(*pairs[name], Request(f"http://a.test/{name}"))
    renewals = s.session.renewals
    renewals.start_keeper(q)  # the session renewed at connect: the next full one is far off
    try:
        before = {n: await q.client.zscore(KEYS.leased, pairs[n][0]) for n in ("a", "b")}
        request = Request("http://a.test/new", meta={metakeys.LEASE: pairs["new"]})
        s.inflight.add(*pairs["new"], request)  # a hand-out: nudges an early report
        deadline = time.monotonic() + DEADLINE
        while not await marked(q, pairs["new"][0]):
            assert time.monotonic() < deadline, "the hand-out was never reported to Redis"
            await asyncio.sleep(0.05)
        new_expiry = await q.client.zscore(KEYS.leased, pairs["new"][0])
        assert new_expiry is not None and new_expiry > max(before.values()) + SYNC_LEASE_MS
        for name in ("a", "b"):  # neither renewed nor marked by the early report
            assert await q.client.zscore(KEYS.leased, pairs[name][0]) == before[name]
            assert not await marked(q, pairs[name][0])
    finally:
        await renewals.stop_keeper()
        await q.client.aclose()
