"""A worker keeps its start requests until Redis has them on disk (RDB snapshots alone).

With ``appendonly no`` and ``save`` (Redis's default) a crash of Redis takes the crawl back
to its last snapshot. A worker kept each start request 10 s (``ROOT_RETENTION``), so one
stored since the snapshot and more than 10 s before the crash was lost, with every page only
it led to: a QA run (``save 60 1``, redis-server SIGKILLed 45 s into the crawl, before its
first snapshot) ended ``finished`` with 4,282 of 6,600 pages never crawled. Real servers:
the retention is read from the server's ``INFO persistence``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

import pytest
import redis.asyncio
import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.scheduler import outbox as _outbox
from scrapy_ha.scheduler.outbox import Retained
from scrapy_ha.scheduler.session.durable import Durability
from scrapy_ha.store.wire import NewEntry
from tests import redis_servers
from tests.spiders import CatalogueSpider
from tests.test_redis_failover import DEADLINE, crawl_settings

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
        retained = Retained()
        durability = Durability(retained)
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
        retained = Retained()
        durability = Durability(retained)
        retained.keep(1, [_root(1)])
        assert await _pruned(retained, durability, client) == [1]  # within its retention
        time.sleep(RETENTION + 0.1)
        assert await _pruned(retained, durability, client) == []  # AOF has it
        await client.config_set("appendonly", "no")
        retained = Retained()
        durability = Durability(retained)
        retained.keep(2, [_root(2)])
        time.sleep(RETENTION + 0.1)
        assert await _pruned(retained, durability, client) == [2]  # RDB alone, no snapshot
        monkeypatch.setattr(_outbox, "ROOT_MAX_AGE", RETENTION)
        assert await _pruned(retained, durability, client) == []  # kept an hour at most
    finally:
        await client.aclose()
        server.kill()


class _Roots(CatalogueSpider):
    """40 start requests, one an item page each: every item is a root's."""

    name = "roots40"

    async def start(self):  # type: ignore[override]
        for n in range(1, 41):
            yield scrapy.Request(
                f"{self.start_urls[0][: -len('/list/1')]}/item/{n}", self.parse_item
            )


@deferred_f_from_coro_f
async def test_a_crawl_keeps_its_roots_past_a_crash_before_any_snapshot(
    tmp_path: Path, site_factory
):
    """A worker's round prunes what it keeps before it looks at Redis's persistence
    (sync.py), and a worker that had not looked yet took every root for on disk: the first
    round after a root's 10 s forgot it, so the look that followed found none to keep. A
    QA run (200 start URLs, ``save 3600 1``, redis-server SIGKILLed 19 s in and started
    again): no request stored again, 38 of 200 pages crawled, ``finished``."""
    crawler = await _crawl_through_crashes(tmp_path, site_factory, (13,))
    ids = {item["id"] for item in crawler.spider.items}
    assert sorted(ids) == list(range(1, 41)), f"{40 - len(ids)} of 40 never crawled"
    assert crawler.stats.get_value("ha/children_stored_again", 0) > 0


@pytest.mark.long  # (two crashes, 50 s: the crash before any snapshot runs in CI)
@deferred_f_from_coro_f
async def test_roots_stored_again_are_kept_until_a_snapshot_has_them(tmp_path: Path, site_factory):
    """A server that came back without the roots counts its start as a snapshot (``INFO
    persistence``), and the roots stored again on it kept the time they were first stored,
    before that start: the worker forgot them at once, and a second crash before a snapshot
    lost them. A QA run (200 start URLs, ``save 3600 1``, redis-server SIGKILLed 19 s in and
    again 22 s after it came back): ``finished`` with 46 of 200 pages crawled."""
    crawler = await _crawl_through_crashes(tmp_path, site_factory, (13, 12))
    ids = {item["id"] for item in crawler.spider.items}
    assert sorted(ids) == list(range(1, 41)), f"{40 - len(ids)} of 40 never crawled"


async def _crawl_through_crashes(tmp_path: Path, site_factory: Any, waits: tuple[int, ...]) -> Any:
    """Crawl the 40 start pages of a slow site (0.6 s a page, one at a time: some 24 s) on
    a Redis of RDB snapshots alone (``save 3600 1``), SIGKILLed after each of *waits*
    seconds (each past the roots' 10 s, no snapshot meanwhile) and started again empty on
    the same port; return the crawler once the crawl ended."""
    site = site_factory("--pages", "4", "--per-page", "10", "--delay", "0.6")
    server = redis_servers.start(tmp_path / "redis", "--save", "3600 1")
    settings = crawl_settings(f"redis://127.0.0.1:{server.port}/0", CONCURRENT_REQUESTS=1)
    settings["HA_PREFETCH"] = 1
    crawler = get_crawler(_Roots, settings)
    crawl = asyncio.ensure_future(crawler.crawl_async(base_url=site.url))
    try:
        for n, wait in enumerate(waits):
            await asyncio.sleep(wait)
            assert not crawl.done()
            assert n or len(crawler.spider.items) < 35  # (the first crash: a crawl under way)
            server.kill()
            server = redis_servers.start(tmp_path / "redis", "--save", "3600 1", port=server.port)
        await asyncio.wait_for(crawl, DEADLINE)
    finally:
        server.kill()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(crawl, 5)
    return crawler
