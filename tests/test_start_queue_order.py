"""Start requests keep an order of their own in Redis, as in Scrapy's start queues
(``SCHEDULER_START_MEMORY_QUEUE``): at equal priority every other request goes first, and
start requests follow their own FIFO/LIFO order; unset, they share the others' order (real
redis-server, the real sync script)."""

from __future__ import annotations

import pytest
import redis.asyncio
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.config.scheduler import SchedulerConfig
from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry

KEYS = Keys("ha", "s")


def entry(name: str, priority: int = 0, *, start: bool = False) -> NewEntry:
    return NewEntry(name.encode(), priority, name.encode(), start=start)


@pytest.mark.parametrize(
    ("order", "start_order", "expected"),
    [
        # Scrapy's defaults: callbacks' requests LIFO, then start requests FIFO
        ("lifo", "fifo", ["c2", "c1", "s1", "s2", "low"]),
        ("lifo", "lifo", ["c2", "c1", "s2", "s1", "low"]),
        ("fifo", "fifo", ["c1", "c2", "s1", "s2", "low"]),
        ("lifo", "", ["c2", "s2", "c1", "s1", "low"]),  # one shared queue
    ],
)
@deferred_f_from_coro_f
async def test_start_requests_go_after_the_others_of_their_priority(
    redis_url: str, order: str, start_order: str, expected: list[str]
) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    q = RedisQueue(client, KEYS, order=order, start_order=start_order)
    await q.sync(
        enqueue=[
            entry("s1", start=True),
            entry("c1"),
            entry("low", -1),
            entry("s2", start=True),
            entry("c2"),
        ]
    )
    leased = (await q.sync(lease=10)).leases
    assert [lease.payload.decode() for lease in leased] == expected
    await client.aclose()


@pytest.mark.parametrize(
    ("order", "start_order", "expected"),
    [
        ("lifo", "fifo", ["a/1", "b/1", "a/2", "b/2"]),  # Scrapy's defaults
        ("lifo", "lifo", ["b/2", "a/2", "b/1", "a/1"]),
        ("fifo", "fifo", ["a/1", "b/1", "a/2", "b/2"]),
        ("fifo", "lifo", ["b/2", "a/2", "b/1", "a/1"]),
    ],
)
@pytest.mark.parametrize("one_call", [True, False])
@deferred_f_from_coro_f
async def test_start_requests_of_several_hosts_keep_their_order(
    redis_url: str, order: str, start_order: str, expected: list[str], one_call: bool
) -> None:
    """Across hosts (a back queue each) the order comes from the queues' scores. Before: a
    FIFO start queue in a LIFO crawl (Scrapy's defaults) was scored as LIFO, so its hosts
    went newest first: b/1, b/2, a/1, a/2."""
    client = redis.asyncio.Redis.from_url(redis_url)
    q = RedisQueue(client, KEYS, order=order, start_order=start_order)
    names = ["a/1", "b/1", "a/2", "b/2"]
    await q.sync(
        enqueue=[
            NewEntry(n.encode(), 0, n.encode(), start=True, host=n.split("/")[0]) for n in names
        ]
    )
    if one_call:
        leased = (await q.sync(lease=10)).leases
    else:
        leased = [(await q.sync(lease=1)).leases[0] for _ in names]
    assert [lease.payload.decode() for lease in leased] == expected
    await client.aclose()


@deferred_f_from_coro_f
async def test_a_start_request_given_back_keeps_its_place(redis_url: str) -> None:
    """Scrapy's defaults (LIFO, start requests FIFO). Before: given back, a/1 went after
    a/2 and a/3, its place compared with scores of the wrong order."""
    client = redis.asyncio.Redis.from_url(redis_url)
    q = RedisQueue(client, KEYS, order="lifo", start_order="fifo")
    names = ["a/1", "a/2", "a/3"]
    await q.sync(enqueue=[NewEntry(n.encode(), 0, n.encode(), start=True, host="a") for n in names])
    [first] = (await q.sync(lease=1)).leases
    assert first.payload == b"a/1"
    assert (await q.sync(release=[(first.id, first.token)])).released == 1
    leased = (await q.sync(lease=10)).leases
    assert [lease.payload.decode() for lease in leased] == names
    await client.aclose()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "fifo"),  # Scrapy's default FifoMemoryQueue
        ("scrapy.squeues.LifoMemoryQueue", "lifo"),
        ("", ""),
    ],
)
def test_the_start_queue_setting_picks_the_order(value: str | None, expected: str) -> None:
    settings = Settings({} if value is None else {"SCHEDULER_START_MEMORY_QUEUE": value})
    assert SchedulerConfig.from_settings(settings).start_order == expected
