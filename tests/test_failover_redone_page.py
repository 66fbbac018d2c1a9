"""A page whose ack and children a failover lost is redone with its children, by the same
worker too.

A primary confirms a round that stores a page's children and a later one that acks the
page (the worker then lets the children go: docs/scaling.md, "Children the old primary
confirmed"), then fails before its replica has either: the promoted replica holds the page leased
and none of its children. The page's lease expires there and it is crawled again, and its
children come back with it (docs/scaling.md, "What Redis itself can lose"). But the worker
that crawled it first remembers their fingerprints (a worker drops the duplicates it sent
itself before they reach Redis), and when that same worker redid the page it dropped every
child as seen: the crawl ended without them (a QA run: 116 of 150 list pages and their
detail pages never crawled, the run "finished"). Real servers, a real crawl, the TCP
forwarder of tests/test_failover_lost_children.py standing for the failover.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.keys import Keys
from tests import backqueues
from tests.spiders import CatalogueSpider
from tests.test_failover_lost_children import Forwarder, _replicating, _servers, tear_down
from tests.test_redis_failover import DEADLINE, crawl_settings, until

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


class HeldPagesSpider(CatalogueSpider):
    """The first list page waits for the test before it yields its children; the second
    waits for the test before it yields anything (so that nothing it yields is stored
    before the failover)."""

    name = "held_pages"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reached, self.go_on, self.second = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self.firsts = 0

    async def parse(self, response: Any) -> Any:
        if response.url.endswith("/list/1"):
            self.firsts += 1
            if self.firsts == 1:
                self.reached.set()
                await self.go_on.wait()
        elif response.url.endswith("/list/2"):
            await self.second.wait()
        for output in super().parse(response):
            yield output


@deferred_f_from_coro_f
async def test_the_same_worker_redoing_a_page_a_failover_lost_stores_its_children(
    tmp_path: Path, site_factory
):
    site = site_factory("--pages", "2", "--per-page", "10", "--delay", "0.2")
    primary, replica = _servers(tmp_path)
    a, b = primary.client(), replica.client()
    forwarder = Forwarder(primary.port)
    await forwarder.start()
    keys = Keys("ha", HeldPagesSpider.name)
    # the add-on's middleware tells each child its page (a child without one is kept as a
    # root, for 10 s, and stored again by the fence)
    parent = {"scrapy_ha.parent.ParentLeaseMiddleware": 10}
    url = f"redis://127.0.0.1:{forwarder.port}/0"
    settings = crawl_settings(url, HA_LEASE_TIME=3, SPIDER_MIDDLEWARES=parent)
    crawler = get_crawler(HeldPagesSpider, settings)
    crawl = asyncio.ensure_future(crawler.crawl_async(base_url=site.url))
    try:
        await until(lambda: _replicating(a), "the replica")
        await until(lambda: crawler.spider is not None and crawler.spider.reached.is_set(), "p1")
        spider = crawler.spider
        await until(lambda: b.zcard(keys.leased) == 1, "the first page's lease replicated")
        [page] = b.zrange(keys.leased, 0, -1)
        b.replicaof("NO", "ONE")  # from here the replica gets nothing more
        spider.go_on.set()  # the first page yields its children and ends

        def acked_and_confirmed() -> bool:
            # the primary acked the page, and the worker has read the reply that says so
            if a.hexists(keys.leases, page):
                return False
            done = int(a.hget(keys.stats, "acked") or 0)
            return crawler.stats.get_value("ha/acked", 0) >= done

        await until(acked_and_confirmed, "the first page's ack confirmed by the primary")
        # and the worker no longer keeps its children: a failover now loses them with the
        # ack, and the page is done again (the next pruning, within a second)
        outbox = crawler.engine._slot.scheduler.outbox
        await until(lambda: not outbox.retained.newest(), "the children let go")
        assert backqueues.count(b, keys) == 0, "the children reached the replica"
        assert b.hexists(keys.leases, page), "the replica lacks the first page's lease"
        forwarder.switch(replica.port)  # the failover: the worker now reaches the replica
        primary.kill()
        spider.second.set()
        # the first page's lease expires on the replica, and this worker, the only one,
        # crawls it again
        await asyncio.wait_for(crawl, DEADLINE)
    finally:
        await tear_down(forwarder, (primary, replica), (a, b), crawl)
    assert crawler.spider.firsts >= 2, "the first page was not crawled again"
    ids = {item["id"] for item in crawler.spider.items}
    assert sorted(ids) == list(range(1, 21)), f"lost: {sorted(set(range(1, 21)) - ids)}"
