"""A GET a worker hands out before Redis has it downloads while the round that stores it is
on its way (``HA_EARLY_DOWNLOAD``): what comes of it waits for the round's verdict, so a
request Redis refuses costs a download, never a callback or an errback. Other methods wait
for the verdict before they download, and a worker whose new requests Redis often refuses
stops downloading early (scrapy_ha.scheduler.gate.EarlyGuard)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request, Spider, signals
from scrapy.core.downloader.middleware import DownloaderMiddlewareManager
from scrapy.core.engine import ExecutionEngine
from scrapy.http import HtmlResponse
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha import metakeys
from scrapy_ha.demo import harness
from scrapy_ha.keys import Keys
from scrapy_ha.middlewares.registry import scheduler_for
from scrapy_ha.scheduler import gate as gate_module
from scrapy_ha.scheduler.admission import FINGERPRINT_BYTES
from scrapy_ha.scheduler.engine import gate_downloads
from scrapy_ha.scheduler.fresh import FreshQueue, Handout
from scrapy_ha.scheduler.outbox import Outbox
from scrapy_ha.store.wire import Fresh
from tests.test_fresh_handout import settings as fresh_settings

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

    from tests.conftest import RedisServer

DELAY_LINE = Path(__file__).resolve().parent.parent / "bench" / "latency_proxy.py"

#: New requests the guard must have seen stored before it lets downloads start early (half
#: the window), made small for these crawls.
WINDOW = 20


@pytest.fixture(autouse=True)
def small_window(monkeypatch):
    monkeypatch.setattr(gate_module, "EARLY_WINDOW", WINDOW)
    monkeypatch.setattr(ExecutionEngine, "_SLOT_HEARTBEAT_INTERVAL", 0.2)


@pytest.fixture
def distant_redis_url(redis_url: str, redis_server: RedisServer) -> Iterator[str]:
    """*redis_url*'s database 5 ms away each way (the benchmarks' delay line): a round's
    verdict comes after the download of what it stores has started."""
    command = [sys.executable, str(DELAY_LINE), "--to", str(redis_server.port)]
    proc = harness.spawn([*command, "--delay-ms", "5"], stdout=subprocess.PIPE)
    try:
        port = harness.read_listening(proc, "the delay line")[0]
        yield redis_url.replace(f":{redis_server.port}/", f":{port}/")
    finally:
        harness.stop(proc)


def settings(redis_url: str, **extra: Any) -> dict[str, Any]:
    middlewares = {__name__ + ".SeesTheGate": 950}
    extra = {"DOWNLOADER_MIDDLEWARES": middlewares, "HA_EARLY_DOWNLOAD": True, **extra}
    return fresh_settings(redis_url, **extra)


def _state(spider: Spider, request: Request) -> object:
    """The gate's state for *request*: "early" (downloading, no verdict yet), a verdict
    not taken yet, "absent" (none expected, or taken)."""
    scheduler = scheduler_for(spider.crawler)
    assert scheduler is not None
    lease = request.meta.get(metakeys.LEASE)
    pair = (str(lease[0]), str(lease[1])) if lease else None
    return scheduler.handout.gate._waiting.get(pair, "absent") if pair else "absent"


class SeesTheGate:
    """A middleware near the downloader: records, for each request about to download,
    what the gate knew of it then."""

    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Any) -> SeesTheGate:
        return cls(crawler)

    def process_request(self, request: Request) -> None:
        spider = self.crawler.spider
        spider.before_download.append((request.method, _state(spider, request)))


class NewPagesSpider(Spider):
    """The catalogue's list pages and items (all new), a POST per list page, and an item
    of a port nobody listens on; every callback and errback notes the gate's state."""

    name = "new_pages"

    def __init__(self, base_url: str = "", dead_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/list/1"]
        self.dead_url = dead_url
        self.before_download: list[tuple[str, object]] = []
        self.at_callback: list[object] = []
        self.errbacks: list[str] = []

    def parse(self, response: Any) -> Any:
        self.at_callback.append(_state(self, response.request))
        for href in response.css("a.item::attr(href)").getall():
            yield response.follow(href, callback=self.parse_item)
        yield Request(response.url + "?form", method="POST", body=b"x", callback=self.posted)
        if next_page := response.css("a.next::attr(href)").get():
            yield response.follow(next_page)
        elif self.dead_url:
            yield Request(self.dead_url, callback=self.parse_item, errback=self.failed)

    def parse_item(self, response: Any) -> Any:
        self.at_callback.append(_state(self, response.request))
        yield {"url": response.url}

    def posted(self, response: Any) -> None:
        self.at_callback.append(_state(self, response.request))

    def failed(self, failure: Any) -> None:
        self.at_callback.append(_state(self, failure.request))
        self.errbacks.append(failure.request.url)


@deferred_f_from_coro_f
async def test_new_gets_download_before_the_verdict_and_are_called_back_after_it(
    distant_redis_url, site_factory
):
    site = site_factory("--pages", "4", "--per-page", "15")
    dead_url = "http://127.0.0.1:9/nobody"  # the discard port: connection refused
    crawler = get_crawler(  # room for a page's requests at once: all handed out from memory
        NewPagesSpider,
        settings(
            distant_redis_url,
            RETRY_ENABLED=False,
            HTTPERROR_ALLOW_ALL=True,
            CONCURRENT_REQUESTS=32,
            CONCURRENT_REQUESTS_PER_DOMAIN=32,
        ),
    )
    await crawler.crawl_async(base_url=site.url, dead_url=dead_url)
    spider, stats = crawler.spider, crawler.stats.get_stats()

    assert stats["finish_reason"] == "finished"
    assert stats["item_scraped_count"] == 4 * 15
    early = [method for method, state in spider.before_download if state == "early"]
    assert len(early) >= 3 * 15 and set(early) == {"GET"}  # pages 2-4's items at least
    assert stats["ha/early_downloads"] == len(early)
    posts = [state for method, state in spider.before_download if method == "POST"]
    assert len(posts) == 4 and "early" not in posts  # POSTs waited for their verdict
    assert set(spider.at_callback) == {"absent"}  # no callback before its verdict
    assert len(spider.at_callback) == 4 + 4 * 15 + 4 + 1
    assert spider.errbacks == [dead_url]
    assert "ha/early_dropped" not in stats
    gate = scheduler_for(crawler).handout.gate
    assert not (gate._waiting or gate._early or gate._refused)  # nothing left behind


@deferred_f_from_coro_f
async def test_the_gate_downloads_nothing_early_when_switched_off(redis_url, site_factory):
    site = site_factory("--pages", "4", "--per-page", "15")
    crawler = get_crawler(NewPagesSpider, settings(redis_url, HA_EARLY_DOWNLOAD=False))
    await crawler.crawl_async(base_url=site.url)
    assert crawler.stats.get_value("item_scraped_count") == 4 * 15
    assert "early" not in {state for _, state in crawler.spider.before_download}
    assert crawler.stats.get_value("ha/early_downloads") is None


class KnownLinksSpider(Spider):
    """One page of new items (the guard opens), then a page whose items Redis has seen."""

    name = "known_links"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/list/1"]
        self.base_url = base_url
        self.before_download: list[tuple[str, object]] = []
        self.called_back: list[str] = []
        self.errbacks: list[str] = []

    def parse(self, response: Any) -> Any:
        for href in response.css("a.item::attr(href)").getall():
            yield response.follow(href, callback=self.parse_item, errback=self.failed)
        if response.url.endswith("/list/1"):
            yield Request(self.base_url + "/list/2", callback=self.parse)

    def parse_item(self, response: Any) -> None:
        self.called_back.append(response.url)

    def failed(self, failure: Any) -> None:
        self.errbacks.append(failure.request.url)


@deferred_f_from_coro_f
async def test_requests_redis_refuses_cost_no_callback_and_close_the_early_downloads(
    redis_url, redis_client: redis.Redis, site_factory
):
    """The items of page 2 are duplicates only Redis knows of (an earlier run's, kept with
    SCHEDULER_PERSIST): those downloaded early are dropped as duplicates are, and the
    refusals close the guard, so the rest wait for their verdict and never download."""
    per_page = 30
    site = site_factory("--pages", "2", "--per-page", str(per_page))
    crawler = get_crawler(
        KnownLinksSpider, settings(redis_url, SCHEDULER_PERSIST=True, CONCURRENT_REQUESTS=4)
    )
    known = [f"{site.url}/item/{n}" for n in range(per_page + 1, 2 * per_page + 1)]
    dupefilter = Keys("ha", "known_links").dupefilter
    for url in known:
        fingerprint = crawler.request_fingerprinter.fingerprint(Request(url))
        redis_client.sadd(dupefilter, fingerprint[:FINGERPRINT_BYTES])
    dropped: list[str] = []

    def on_dropped(request: Request, spider: Spider) -> None:  # held here: signals hold weakly
        dropped.append(request.url)

    crawler.signals.connect(on_dropped, signal=signals.request_dropped)
    await crawler.crawl_async(base_url=site.url)
    spider, stats = crawler.spider, crawler.stats.get_stats()

    assert stats["finish_reason"] == "finished"
    assert sorted(spider.called_back) == sorted(f"{site.url}/item/{n}" for n in range(1, 31))
    assert spider.errbacks == []
    hits = site.hits()
    downloaded_known = sum(hits.get(url.removeprefix(site.url), 0) for url in known)
    assert stats.get("ha/early_dropped", 0) == downloaded_known  # each wasted download counted
    assert downloaded_known <= 4  # at most what the engine had room for before a verdict
    assert set(dropped) <= set(known) and len(dropped) >= downloaded_known
    assert stats["dupefilter/filtered"] == per_page
    scheduler = scheduler_for(crawler)
    assert scheduler is not None and not scheduler.handout.gate.guard.allows()


def _gate(*, opened: bool = True) -> tuple[gate_module.DownloadGate, MemoryStatsCollector]:
    stats = MemoryStatsCollector(get_crawler(Spider))
    gate = gate_module.DownloadGate(stats)
    gate.installed = True
    if opened:
        gate.guard.note(WINDOW, WINDOW)  # enough new requests stored, none refused
    return gate, stats


def _handed(gate: gate_module.DownloadGate, n: int, method: str = "GET") -> Request:
    pair = (f"abc.{n}", f"abc-{n}")
    gate.expect(pair)
    return Request(f"http://example.com/{n}", method=method, meta={metakeys.LEASE: pair})


async def _through(value: Any) -> Any:
    return (await value) if asyncio.iscoroutine(value) else value


@deferred_f_from_coro_f
async def test_a_get_refused_after_its_early_download_is_turned_back_with_its_response():
    gate, stats = _gate()
    request = _handed(gate, 1)
    assert gate.process_request(request) is None  # downloads at once
    response = HtmlResponse(request.url, body=b"<html></html>", request=request)
    held = asyncio.ensure_future(_through(gate.process_response(request, response)))
    await asyncio.sleep(0)
    assert not held.done()  # the response waits for the verdict
    gate.settle(("abc.1", "abc-1"), stored=False)
    assert await held is request  # turned back: the engine schedules it, the scheduler
    assert gate.dropped(request)  # refuses it (request_dropped), no callback
    assert stats.get_value("ha/early_downloads") == 1
    assert stats.get_value("ha/early_dropped") == 1

    request = _handed(gate, 2)
    assert gate.process_request(request) is None
    gate.settle(("abc.2", "abc-2"), stored=False)  # the verdict before the response
    assert stats.get_value("ha/early_dropped") == 2
    assert await _through(gate.process_exception(request, OSError("reset"))) is request
    assert gate.dropped(request) and not gate._waiting


@deferred_f_from_coro_f
async def test_a_stored_get_goes_on_with_its_response_or_its_error():
    gate, _ = _gate()
    request = _handed(gate, 1)
    assert gate.process_request(request) is None
    response = HtmlResponse(request.url, body=b"", request=request)
    held = asyncio.ensure_future(_through(gate.process_response(request, response)))
    await asyncio.sleep(0)
    gate.settle(("abc.1", "abc-1"), stored=True)
    assert await held is response
    request = _handed(gate, 2)
    assert gate.process_request(request) is None
    gate.settle(("abc.2", "abc-2"), stored=True)
    assert await _through(gate.process_exception(request, OSError("reset"))) is None
    assert not gate._waiting and not gate.dropped(request)


@deferred_f_from_coro_f
async def test_a_post_and_a_get_before_the_guard_opens_wait_for_their_verdict_to_download():
    for gate, method in ((_gate()[0], "POST"), (_gate(opened=False)[0], "GET")):
        request = _handed(gate, 1, method)
        waiting = asyncio.ensure_future(_through(gate.process_request(request)))
        await asyncio.sleep(0)
        assert not waiting.done()
        gate.settle(("abc.1", "abc-1"), stored=True)
        assert await waiting is None  # now it downloads
        response = HtmlResponse(request.url, body=b"", request=request)
        assert gate.process_response(request, response) is response  # nothing to wait for


def test_the_guard_opens_after_half_a_window_and_closes_past_one_percent_refused():
    guard = gate_module.EarlyGuard(enabled=True)
    guard.note(WINDOW // 2 - 1, WINDOW // 2 - 1)
    assert not guard.allows()
    guard.note(1, 1)
    assert guard.allows()
    guard.note(WINDOW, WINDOW - 1)  # 1 refused of ~30 in the window: over 1%
    assert not guard.allows()
    for _ in range(8):  # new requests stored since: the refusal weighs less and less
        guard.note(WINDOW, WINDOW)
    assert guard.allows()
    assert not gate_module.EarlyGuard(enabled=False).allows()


@deferred_f_from_coro_f
async def test_a_copy_a_middleware_made_of_a_refused_early_download_is_refused_too():
    """A middleware after the gate may give back a copy of the request with its lease
    before the download (scrapy-ha's proxy middleware does when it has no proxy to give):
    if Redis refused the original meanwhile, the copy is refused where it comes back."""
    gate, _ = _gate()
    request = _handed(gate, 1)
    assert gate.process_request(request) is None
    copy = request.replace(dont_filter=True)  # what the middleware returns instead
    gate.settle(("abc.1", "abc-1"), stored=False)
    assert gate.dropped(copy)  # enqueue_request refuses it
    assert not (gate._waiting or gate._early or gate._refused)

    request = _handed(gate, 2)  # stored: the copy goes on (a retry of the lease it holds)
    assert gate.process_request(request) is None
    gate.settle(("abc.2", "abc-2"), stored=True)
    assert not gate.dropped(request.replace(dont_filter=True))


@deferred_f_from_coro_f
async def test_the_close_lets_held_downloads_go_on_but_keeps_a_refusal():
    gate, _ = _gate()
    refused, held = _handed(gate, 1), _handed(gate, 2)
    assert gate.process_request(refused) is None and gate.process_request(held) is None
    gate.settle(("abc.1", "abc-1"), stored=False)
    response = HtmlResponse(held.url, body=b"", request=held)
    waiting = asyncio.ensure_future(_through(gate.process_response(held, response)))
    await asyncio.sleep(0)
    gate.open_all()  # the spider closes: no round will come
    assert await waiting is response
    late = _handed(gate, 3)  # handed out after: nothing to wait for
    assert gate.process_request(late) is None and not gate._waiting
    error = gate.process_exception(refused, OSError("reset"))
    assert await _through(error) is refused  # still turned back


class OnlyRequests:
    def process_request(self, request: Request) -> None:
        return None


def test_the_gate_is_installed_at_both_ends_even_where_no_middleware_handles_errors():
    """Scrapy's manager keeps each method's chain in a defaultdict: a chain no middleware
    fills is absent (here only a process_request is), and the gate must create it, or an
    early download's error would reach the errback before its verdict."""
    crawler = get_crawler(Spider)
    manager = DownloaderMiddlewareManager(OnlyRequests(), crawler=crawler)
    assert "process_exception" not in manager.methods
    crawler.engine = SimpleNamespace(downloader=SimpleNamespace(middleware=manager))
    gate, _ = _gate()
    assert gate_downloads(crawler, gate)
    assert manager.methods["process_request"][0] == gate.process_request
    assert manager.methods["process_response"][0] == gate.process_response
    assert manager.methods["process_exception"][0] == gate.process_exception


@deferred_f_from_coro_f
async def test_a_copy_made_before_the_verdict_leaves_nothing_behind():
    """The proxy middleware's wait gives back a copy before the round's verdict; the
    scheduler takes it as a retry of the request it holds (the lease moves to the delayed
    set when that request ends, or is forgotten if Redis refuses it)."""
    gate, _ = _gate()
    request = _handed(gate, 1)
    assert gate.process_request(request) is None
    gate.replaced(request.replace(dont_filter=True))
    gate.settle(("abc.1", "abc-1"), stored=False)
    assert not (gate._waiting or gate._early or gate._refused)


def test_no_early_download_while_the_worker_redoes_a_page_another_left_unfinished():
    """A page whose lease expired before was left by a worker that died: the links it
    yields are likely in Redis already, so nothing downloads early until it is done."""
    gate, _ = _gate()
    held = [("7", "t7")]
    gate.guard.held = lambda: held
    assert gate.guard.allows()
    gate.guard.redo("7")
    assert not gate.guard.allows()
    held.clear()  # acked, released or lost: no longer this worker's
    assert gate.guard.allows()


@deferred_f_from_coro_f
async def test_the_links_of_a_page_redone_here_wait_for_their_verdict_even_once_it_is_done():
    """The engine takes a page's links as it has room, often once the page is done. Those
    of a page redone here are likely in Redis already, held by the worker that died:
    downloaded early, such a link was downloaded a third time (by the dead worker, early
    here, then by the redo of its own lease)."""
    crawler = get_crawler(Spider)
    handout = Handout(
        crawler,
        Outbox(),
        SimpleNamespace(add=lambda *args, **kwargs: None),  # type: ignore[arg-type]
        SimpleNamespace(handed=lambda *args: None),  # type: ignore[arg-type]
        lambda: None,
        queue=FreshQueue(lifo=False),
    )
    gate = handout.gate
    gate.installed = True
    gate.guard.note(WINDOW, WINDOW)  # open: enough new requests stored, none refused
    held = [("7", "t7"), ("8", "t8")]
    gate.guard.held = lambda: held
    gate.guard.redo("7")  # page 7 was taken after its lease expired; page 8 was not
    for n, page in ((1, ("7", "t7")), (2, ("8", "t8"))):
        handout.push(Fresh(Request(f"http://example.com/{n}")), page)
    held.clear()  # both pages are done: their leases are no longer this worker's
    assert gate.guard.allows()
    link = handout.hand(handout.queue.head())
    other = handout.hand(handout.queue.head())
    assert gate.process_request(other) is None  # another page's link: downloads early
    waiting = asyncio.ensure_future(_through(gate.process_request(link)))
    await asyncio.sleep(0)
    assert not waiting.done()  # waits for its verdict
    gate.settle(link.meta[metakeys.LEASE], stored=False)  # a duplicate: never downloaded
    assert await waiting is link and gate.dropped(link)


def test_without_early_downloads_only_the_gates_process_request_is_installed():
    """Without HA_EARLY_DOWNLOAD no response or error waits for its verdict: the gate's
    process_response and process_exception would give back their input, a middleware call
    of Scrapy's per page each for nothing."""
    crawler = get_crawler(Spider)
    manager = DownloaderMiddlewareManager(OnlyRequests(), crawler=crawler)
    crawler.engine = SimpleNamespace(downloader=SimpleNamespace(middleware=manager))
    gate = gate_module.DownloadGate(MemoryStatsCollector(crawler), early=False)
    assert not gate.holds_results
    assert gate_downloads(crawler, gate)
    assert manager.methods["process_request"][0] == gate.process_request
    assert gate.process_response not in manager.methods.get("process_response", ())
    assert gate.process_exception not in manager.methods.get("process_exception", ())
