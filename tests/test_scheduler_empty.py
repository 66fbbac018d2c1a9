"""``scheduler_empty`` is sent only when no request is on its way to this worker (issue 17,
item 7).

Scrapy's engine sends it whenever ``next_request()`` returns None, and Scrapy's own
scheduler returns None only when it holds nothing. scrapy-ha's ``next_request()`` also
returns None while requests that went to Redis are being leased back (a round trip): the
signal must wait then, or a spider that feeds its start requests lazily from it (Scrapy's
docs, "lazy start requests") is fed while work is waiting. Redis is reached here through
a TCP hop that delays its replies, as a Redis a network away does, so that the round trip
is longer than a download from the local site. ``next_request()`` returns None too while
``HA_MAX_INFLIGHT`` requests are unfinished: with items that take a while in the pipelines,
responses wait in the scraper, the downloader has room, the engine asks, and requests wait
in the buffer (a slower machine did that with the fast items: issue 36 item 19).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest
import scrapy
from scrapy import Request, signals
from scrapy.core.engine import ExecutionEngine
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.middlewares.registry import scheduler_for

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from tests.conftest import Site

#: Seconds each reply of Redis is held back by the hop: far longer than a download from the
#: local site, so that the engine asks for a request while a lease is on its way.
LATENCY = 0.05
#: Bytes read at once from either side of the hop.
CHUNK = 65536
#: List pages the spider starts from, and items on each (the site fixture's catalogue).
LISTS, PER_LIST = 2, 10
#: Seconds an item spends in the slow pipeline: longer than a download from the local site,
#: so that two responses wait in the scraper (HA_MAX_INFLIGHT = 2) while the downloader is
#: empty.
SLOW_ITEM = 0.05


@pytest.fixture(autouse=True)
def fast_engine_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine asks the scheduler every 0.1 s while idle (Scrapy's tests do the same)."""
    monkeypatch.setattr(ExecutionEngine, "_SLOT_HEARTBEAT_INTERVAL", 0.1)


class SlowHop:
    """A TCP relay to a Redis server that delays each reply by *latency* seconds."""

    def __init__(self, redis_url: str, latency: float) -> None:
        parts = urlsplit(redis_url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 6379
        self.path = parts.path
        self.latency = latency
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> str:
        """Listen; returns the URL to give the crawl instead of *redis_url*."""
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}{self.path}"

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        redis_r, redis_w = await asyncio.open_connection(self.host, self.port)
        for task in (
            asyncio.ensure_future(self._pipe(client_r, redis_w, 0.0)),
            asyncio.ensure_future(self._pipe(redis_r, client_w, self.latency)),
        ):
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, delay: float) -> None:
        try:
            while data := await src.read(CHUNK):
                if delay:
                    await asyncio.sleep(delay)
                dst.write(data)
                await dst.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                dst.close()


class SlowItems:
    """An item pipeline that takes ``ITEM_DELAY`` seconds per item (a database write)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    @classmethod
    def from_crawler(cls, crawler: Any) -> SlowItems:
        return cls(crawler.settings.getfloat("ITEM_DELAY"))

    async def process_item(self, item: Any) -> Any:
        await asyncio.sleep(self.delay)
        return item


class LazyListSpider(scrapy.Spider):
    """Scrapy's lazy start pattern: the next start request only once the engine has room or
    the scheduler says it is empty. Each list page yields all its items at once: with one
    request at a time, all but the first go to Redis and are leased back."""

    name = "lazy_lists"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base_url = base_url
        self.empty_calls = 0
        self.empty_while_pending: list[str] = []

    async def start(self) -> AsyncIterator[Any]:
        self.crawler.signals.connect(self._empty, signal=signals.scheduler_empty)
        for n in range(1, LISTS + 1):
            if self.crawler.engine.needs_backout():
                await self.crawler.signals.wait_for(signals.scheduler_empty)
            yield Request(f"{self.base_url}/list/{n}")

    def _empty(self) -> None:
        self.empty_calls += 1
        scheduler = scheduler_for(self.crawler)
        assert scheduler is not None
        if scheduler.has_pending_requests():
            session = scheduler.session
            self.empty_while_pending.append(
                f"buffered={scheduler.buffered()} unsent={len(scheduler.outbox.children)} "
                f"redis_pending={session.remote.waiting}"
            )

    def parse(self, response: Any) -> Any:
        for href in response.css("a.item::attr(href)").getall():
            yield response.follow(href, callback=self.parse_item)

    def parse_item(self, response: Any) -> Any:
        yield {"id": int(response.css("span.id::text").get())}


@pytest.mark.parametrize("item_delay", [0, SLOW_ITEM], ids=["fast-items", "slow-items"])
@deferred_f_from_coro_f
async def test_scheduler_empty_waits_for_requests_on_their_way_back_from_redis(
    redis_url: str, site: Site, item_delay: float
) -> None:
    hop = SlowHop(redis_url, LATENCY)
    url = await hop.start()
    try:
        settings = {
            "SCHEDULER": "scrapy_ha.Scheduler",
            "REDIS_URL": url,
            "HA_IDLE_TIMEOUT": 0.3,
            "HA_PREFETCH": 2,
            "CONCURRENT_REQUESTS": 1,
            "LOG_LEVEL": "INFO",
            "ITEM_DELAY": item_delay,
            "ITEM_PIPELINES": {SlowItems: 300} if item_delay else {},
        }
        crawler = get_crawler(LazyListSpider, settings)
        await crawler.crawl_async(base_url=site.url)
    finally:
        await hop.stop()
    assert crawler.stats is not None
    assert crawler.stats.get_value("finish_reason") == "finished"
    hits = site.hits()
    assert all(hits.get(f"/list/{n}") == 1 for n in range(1, LISTS + 1)), hits
    assert sum(1 for path in hits if path.startswith("/item/")) == LISTS * PER_LIST, hits
    spider = crawler.spider
    assert isinstance(spider, LazyListSpider)
    assert spider.empty_calls > 0  # the handler ran: the test can see an early signal
    assert spider.empty_while_pending == []
