"""A worker keeps its start requests until Redis has them on disk (RDB snapshots alone).

With ``appendonly no`` and ``save`` (Redis's default) a crash of Redis takes the crawl back
to its last snapshot. A worker kept each start request 10 s (``ROOT_RETENTION``), so one
stored since the snapshot and more than 10 s before the crash was lost, with every page only
it led to: a QA run (``save 60 1``, redis-server SIGKILLed 45 s into the crawl, before its
first snapshot) ended ``finished`` with 4,282 of 6,600 pages never crawled. Real servers:
the retention is read from the server's ``INFO persistence``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.scheduler import outbox as _outbox
from scrapy_ha.scheduler.outbox import Retained
from scrapy_ha.scheduler.session.durable import Durability
from scrapy_ha.store.wire import NewEntry
from tests import redis_servers

if TYPE_CHECKING:
    from pathlib import Path


def _root(n: int) -> NewEntry:
    return NewEntry(b"fp%d" % n, 0, b"{}", parent=None)


async def _pruned(retained: Retained, durability: Durability, client: object) -> list[int]:
    durability._looked = -1e18  # (look now, whatever the interval)
    await durability.look(client, retained)
    retained._pruned = -1e18
    retained.prune(list)
    return [e[0] for e in retained.entries]


#: a root's retention here (10 s in a worker), so that the tests wait less
RETENTION = 1.0


@deferred_f_from_coro_f
async def test_a_root_is_kept_until_a_snapshot_has_it(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(_outbox, "ROOT_RETENTION", RETENTION)
    server = redis_servers.start(tmp_path / "redis", "--save", "3600 1")
    client = redis.asyncio.Redis(port=server.port)
    try:
        time.sleep(2.1)  # (Redis counts its start as a snapshot; its times are whole seconds)
        retained, durability = Retained(), Durability()
        retained.keep(1, [_root(1)])
        time.sleep(RETENTION + 0.1)
        # past its retention, but the last snapshot (the server's start) does not hold it
        assert await _pruned(retained, durability, client) == [1]
        time.sleep(1.1)
        assert await _pruned(retained, durability, client) == [1]
        await client.save()  # began 2.2 s after the root was stored
        assert await _pruned(retained, durability, client) == []
    finally:
        await client.aclose()
        server.kill()


@deferred_f_from_coro_f
async def test_a_root_goes_after_its_retention_with_aof_or_after_an_hour(
    tmp_path: Path, monkeypatch
):
    monkeypatch.setattr(_outbox, "ROOT_RETENTION", RETENTION)
    server = redis_servers.start(tmp_path / "redis", "--appendonly", "yes", "--save", "3600 1")
    client = redis.asyncio.Redis(port=server.port)
    try:
        time.sleep(2.1)
        retained, durability = Retained(), Durability()
        retained.keep(1, [_root(1)])
        assert await _pruned(retained, durability, client) == [1]  # within its retention
        time.sleep(RETENTION + 0.1)
        assert await _pruned(retained, durability, client) == []  # AOF has it
        await client.config_set("appendonly", "no")
        retained, durability = Retained(), Durability()
        retained.keep(2, [_root(2)])
        time.sleep(RETENTION + 0.1)
        assert await _pruned(retained, durability, client) == [2]  # RDB alone, no snapshot
        monkeypatch.setattr(_outbox, "ROOT_MAX_AGE", RETENTION)
        assert await _pruned(retained, durability, client) == []  # kept an hour at most
    finally:
        await client.aclose()
        server.kill()
