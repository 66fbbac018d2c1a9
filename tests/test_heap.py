"""With HA_GC_FREEZE (scrapy_ha.scheduler.session.heap) a worker's start-up heap is out of the
garbage collector's passes while it crawls, and back in them a few seconds after the crawl
closes (unless the process stops its reactor first, to exit); with HA_TIMER_SWEEP the asyncio
reactor drops cancelled timers while it crawls."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest
from scrapy import signals
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.scheduler.session import heap
from scrapy_ha.scheduler.session.heap import TimerSweep
from tests.spiders import CatalogueSpider
from tests.test_scheduler_crawl import settings


class FreezeSeenSpider(CatalogueSpider):
    """Notes how many objects were frozen at each item page."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.frozen: list[int] = []

    def parse_item(self, response: Any) -> Any:
        self.frozen.append(gc.get_freeze_count())
        self.owner = self.crawler.engine._slot.scheduler.session.heap.frozen
        return super().parse_item(response)


@pytest.mark.parametrize("freeze", [True, False])
@deferred_f_from_coro_f
async def test_the_start_up_heap_is_frozen_while_crawling_and_thawed_at_close(
    redis_url, site, freeze
):
    assert gc.get_freeze_count() == 0
    crawler = get_crawler(FreezeSeenSpider, settings(redis_url, HA_GC_FREEZE=freeze))
    await crawler.crawl_async(base_url=site.url)
    spider = crawler.spider
    assert len(spider.items) == 50
    if freeze:
        # the crawler, its components, every module imported: tens of thousands of objects
        assert min(spider.frozen) > 10_000
    else:
        assert set(spider.frozen) == {0}
    # the reactor runs on: the thaw waits for THAW_DELAY, in case the process exits first
    assert heap.thaw_pending() is freeze
    assert gc.get_freeze_count() == 0


@deferred_f_from_coro_f
async def test_the_thaw_comes_after_its_delay_while_the_reactor_runs(redis_url, site, monkeypatch):
    monkeypatch.setattr(heap, "THAW_DELAY", 0.2)
    crawler = get_crawler(FreezeSeenSpider, settings(redis_url))
    await crawler.crawl_async(base_url=site.url)
    assert min(crawler.spider.frozen) > 10_000
    for _ in range(200):  # progress, not a clock: until the reactor ran the delayed call
        if not gc.get_freeze_count():
            break
        await asyncio.sleep(0.05)
    assert gc.get_freeze_count() == 0
    assert not heap.thaw_pending()


@deferred_f_from_coro_f
async def test_a_crawl_that_opens_before_the_thaw_takes_the_freeze_over(
    redis_url, redis_client, site, monkeypatch
):
    # without the take-over the second crawl finds the first's freeze, leaves it to its
    # owner, and crawls with its own start-up heap walked by every pass
    monkeypatch.setattr(heap, "THAW_DELAY", 600.0)  # the first's thaw cannot come between
    first = get_crawler(FreezeSeenSpider, settings(redis_url))
    await first.crawl_async(base_url=site.url)
    assert first.spider.owner > 10_000
    redis_client.flushdb()  # a crawl of its own again
    second = get_crawler(FreezeSeenSpider, settings(redis_url))
    await second.crawl_async(base_url=site.url)
    assert len(second.spider.items) == 50
    assert second.spider.owner > 10_000  # this crawl froze the heap itself
    assert heap.thaw_pending()  # and its own thaw is the one pending


def test_a_process_that_stops_its_reactor_after_the_crawl_exits_frozen(redis_url, site):
    """`scrapy crawl`: the reactor stops right after the last crawl. Before, the close
    unfroze the heap, and Python's collection at exit walked all of it once more."""
    code = (
        "import atexit, gc, sys\n"
        "from scrapy.crawler import CrawlerProcess\n"
        "from tests.spiders import CatalogueSpider\n"
        "from tests.test_scheduler_crawl import settings\n"
        "atexit.register(lambda: print('frozen at exit', gc.get_freeze_count()))\n"
        "process = CrawlerProcess(settings(sys.argv[1], TWISTED_REACTOR="
        "'twisted.internet.asyncioreactor.AsyncioSelectorReactor'))\n"
        "process.crawl(CatalogueSpider, base_url=sys.argv[2])\n"
        "process.start()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, redis_url, site.url],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    frozen = int(done.stdout.split("frozen at exit")[-1])
    assert frozen > 10_000


@deferred_f_from_coro_f
async def test_a_crawl_leaves_a_freeze_it_did_not_make_alone(redis_url, site):
    # the host application (or another crawler of the process) froze first: its owner
    # unfreezes it, not this crawl
    gc.freeze()
    frozen = gc.get_freeze_count()
    try:
        crawler = get_crawler(FreezeSeenSpider, settings(redis_url))
        await crawler.crawl_async(base_url=site.url)
        assert len(crawler.spider.items) == 50
        # never frozen again (the count would grow) nor unfrozen; frozen objects freed by
        # reference counting leave the count
        assert 0 < min(crawler.spider.frozen) <= max(crawler.spider.frozen) <= frozen
        assert 0 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


@deferred_f_from_coro_f
async def test_a_worker_that_cannot_start_freezes_nothing():
    """Redis unreachable: the scheduler's open() fails, and nothing is frozen even before
    the close (which would thaw it)."""
    unreachable = {"HA_CONNECT_TIMEOUT": 0.5, "HA_START_TIMEOUT": 0}
    crawler = get_crawler(FreezeSeenSpider, settings("redis://127.0.0.1:9/0", **unreachable))
    frozen_at_open: list[int] = []

    def opened() -> None:  # after the scheduler's open(), started or not; held here
        frozen_at_open.append(gc.get_freeze_count())

    crawler.signals.connect(opened, signal=signals.spider_opened)
    await crawler.crawl_async(base_url="http://127.0.0.1:9")
    assert crawler.stats.get_value("finish_reason") == "ha_start_failed"
    assert frozen_at_open == [0]
    assert gc.get_freeze_count() == 0


def _cancelled_timers(reactor: Any) -> int:
    return sum(1 for call in reactor._pendingTimedCalls + reactor._newTimedCalls if call.cancelled)


@pytest.mark.parametrize("interval", [0.2, 0])
@deferred_f_from_coro_f
async def test_the_sweep_lets_the_reactor_drop_cancelled_timers(interval):
    # 1,000 finished downloads: their DOWNLOAD_TIMEOUT timers armed, then cancelled. The
    # asyncio reactor drops cancelled timers only when one of its timers is due, and none
    # is here (nor, in a busy crawl on reused connections, for minutes).
    from twisted.internet import reactor

    for _ in range(40):  # until no Twisted timer of an earlier test is due within a second
        timeout = reactor.timeout()
        if timeout is None or timeout > 1:
            break
        await asyncio.sleep(0.05)
    for _ in range(1000):
        reactor.callLater(180, int).cancel()
    sweep = TimerSweep(interval)
    sweep.start()
    try:
        await asyncio.sleep(0.5)  # an asyncio timer: no Twisted one
        held = _cancelled_timers(reactor)
    finally:
        sweep.stop()
    if interval:
        assert held < 100
    else:
        assert held >= 1000
        reactor.callLater(0, int)  # due at once: the reactor drops them now
        await asyncio.sleep(0.05)
        assert _cancelled_timers(reactor) < 100


class SweepSeenSpider(CatalogueSpider):
    """Notes whether the scheduler's sweep runs at each item page."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sweeping: list[bool] = []

    def parse_item(self, response: Any) -> Any:
        sweep = self.crawler.engine._slot.scheduler.session.sweep
        self.sweeping.append(sweep._call is not None and sweep._call.running)
        return super().parse_item(response)


@deferred_f_from_coro_f
async def test_a_crawl_sweeps_while_it_runs_and_stops_at_close(redis_url, site):
    crawler = get_crawler(SweepSeenSpider, settings(redis_url))
    await crawler.crawl_async(base_url=site.url)
    assert len(crawler.spider.items) == 50
    assert set(crawler.spider.sweeping) == {True}
    assert crawler.engine is None or crawler.engine._slot is None


def test_the_sweep_never_installs_a_reactor():
    # with TWISTED_REACTOR_ENABLED=False there is none: importing twisted.internet.reactor
    # would install the default one (or fail under AsyncCrawlerProcess's import hook)
    code = (
        "import sys; from scrapy_ha.scheduler.session.heap import TimerSweep; "
        "s = TimerSweep(1.0); s.start(); "
        "assert s._call is None; assert 'twisted.internet.reactor' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


class _Node:
    """An object that can sit in a reference cycle and be watched by a weak reference."""

    me: _Node


def test_the_freeze_frees_a_cycle_that_died_after_pythons_last_full_collection():
    # Python's own full collection runs while Scrapy builds the engine: what dies between it
    # and the freeze sits in the oldest generation, and only a full collection frees it (a
    # collection of the young generations alone, tried once to save that pass, froze it)
    node = _Node()
    node.me = node
    gone = weakref.ref(node)
    gc.collect()  # alive: now in the oldest generation
    del node
    frozen = heap.FrozenHeap(True)
    try:
        frozen.freeze()
        assert frozen.frozen > 0
        assert gone() is None
    finally:
        gc.unfreeze()


def test_pythons_own_frozen_objects_are_nobodys_freeze(monkeypatch):
    # Python 3.12 keeps its immortal objects in the permanent generation, so that a count of
    # frozen objects above 0 did not mean a freeze: the worker never froze on 3.12. Here a
    # few objects frozen stand for them.
    _alive = [_Node() for _ in range(3)]  # (held until the test ends)
    gc.freeze()
    try:
        own = gc.get_freeze_count()
        monkeypatch.setattr(heap, "PYTHON_FROZEN", own)
        frozen = heap.FrozenHeap(True)
        frozen.freeze()
        assert frozen.frozen > own  # the start-up heap frozen
        gc.unfreeze()
        gc.freeze()  # a host application's own freeze: left to it
        monkeypatch.setattr(heap, "PYTHON_FROZEN", 0)
        other = heap.FrozenHeap(True)
        other.freeze()
        assert other.frozen == 0
    finally:
        gc.unfreeze()


#: Imports Scrapy's crawl modules as a worker has them before its scheduler is loaded, then
#: the scheduler, counting the collector's passes while it is imported.
_IMPORT_PASSES = """
import gc, sys
import scrapy.crawler, scrapy.core.engine, scrapy.core.downloader, scrapy.core.scraper
if sys.argv[1] == "disabled":
    gc.disable()
passes = []
def note(phase, info):
    if phase == "start":
        passes.append(info["generation"])
gc.callbacks.append(note)
import scrapy_ha.scheduler
gc.callbacks.clear()
print(passes.count(2), len(passes), gc.isenabled())
"""


@pytest.mark.parametrize("state", ["enabled", "disabled"])
def test_the_scheduler_is_imported_with_no_pass_of_the_collector(state):
    # the import makes some 50,000 objects and no garbage to speak of: its collections (45
    # here before; in a worker a full one among them, 35 ms, with the freeze's own full
    # collection moments later) were wasted. One young pass may follow at once, when the
    # collector is enabled again; it is left as the import found it.
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_PASSES, state],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    full, passes, enabled = done.stdout.split()
    assert full == "0"
    assert int(passes) <= (1 if state == "enabled" else 0)
    assert enabled == str(state == "enabled")
