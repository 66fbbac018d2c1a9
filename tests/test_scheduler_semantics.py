"""The scheduler behaves like Scrapy's where a spider can tell: nothing vanishes silently."""

from __future__ import annotations

import itertools
import json
import logging
import tempfile
from typing import TYPE_CHECKING, Any

import pytest
import scrapy
from scrapy import signals
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.keys import Keys
from scrapy_ha.middlewares.registry import scheduler_for
from scrapy_ha.scheduler.admission import UNSTORABLE_REASON_CHARS
from scrapy_ha.scheduler.shell import Scheduler
from tests import backqueues
from tests.spiders import CatalogueSpider

if TYPE_CHECKING:
    from tests.conftest import Site


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


_OPEN: list[Any] = []


def open_file() -> Any:
    """An open file: no queue can store that (closed after the test)."""
    handle = tempfile.TemporaryFile()  # noqa: SIM115 - the point is an object that stays open
    _OPEN.append(handle)
    return handle


@pytest.fixture(autouse=True)
def close_files():
    yield
    while _OPEN:
        _OPEN.pop().close()


def settings(redis_url: str, **extra: Any) -> dict[str, Any]:
    return {
        "ADDONS": {"scrapy_ha.Addon": 0},
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.3,
        "LOG_LEVEL": "INFO",
        **extra,
    }


class UnstorableChildSpider(CatalogueSpider):
    """Detail requests carry an open file in meta: no queue can store that."""

    name = "unstorable"

    def parse(self, response: Any) -> Any:
        handle = open_file()
        for href in response.css("a.item::attr(href)").getall():
            yield response.follow(href, callback=self.parse_item, meta={"handle": handle})
        next_page = response.css("a.next::attr(href)").get()
        if next_page:
            yield response.follow(next_page, callback=self.parse)


@deferred_f_from_coro_f
async def test_an_unstorable_child_dead_letters_its_parent_with_an_error(
    redis_url, redis_client, site, caplog
):
    errors: list[Any] = []
    crawler = get_crawler(UnstorableChildSpider, settings(redis_url))

    def on_error(failure: Any, response: Any, spider: Any) -> None:
        # the signature Scrapy documents (and CLOSESPIDER_ERRORCOUNT's handler has)
        errors.append((failure, response, spider))

    crawler.signals.connect(on_error, signal=scrapy.signals.spider_error)
    with caplog.at_level(logging.INFO):
        await crawler.crawl_async(base_url=site.url)
    stats = crawler.stats.get_stats()
    assert crawler.spider.items == []
    assert stats["ha/unstorable"] == 50  # 10 detail requests on each of 5 list pages
    assert len(errors) == 50
    assert all(response is None and spider is crawler.spider for _, response, spider in errors)
    assert stats["ha/dead/unstorable"] == 5  # every list page, none acked as done
    assert stats.get("ha/acked", 0) == 0
    keys = Keys("ha", "unstorable")
    dead = [json.loads(v) for v in redis_client.hgetall(keys.dead_info).values()]
    assert len(dead) == 5 and {d["class"] for d in dead} == {"unstorable"}
    assert all(f"child {site.url}/item/" in d["reason"] and "handle" in d["reason"] for d in dead)
    # each names its page's first child, then the next (each refused child replaced the
    # reason of the one before: only the last was named)
    firsts = sorted(int(d["reason"].split(" ", 2)[1].rsplit("/", 1)[1].rstrip(":")) for d in dead)
    assert firsts == [1, 11, 21, 31, 41], [d["reason"] for d in dead]
    assert all(f"; child {site.url}/item/" in d["reason"] for d in dead)
    logged = [
        r for r in caplog.records if r.levelno >= logging.ERROR and "Cannot store" in r.message
    ]
    assert len(logged) == 50
    assert f"{site.url}/item/1" in logged[0].message and "handle" in logged[0].message
    assert "Task exception was never retrieved" not in caplog.text


class ManyUnstorableChildrenSpider(CatalogueSpider):
    """One page yields 3,000 children no queue can store (a sitemap's links, each given
    an open file by mistake)."""

    name = "many_unstorable"

    def parse(self, response: Any) -> Any:
        handle = open_file()
        for i in range(3000):
            yield response.follow(f"/item/{i}", callback=self.parse_item, meta={"handle": handle})


@deferred_f_from_coro_f
async def test_the_reason_of_a_page_with_many_unstorable_children_stays_short(
    redis_url, redis_client, site
):
    # each refused child was added to the page's reason, whole: 3,000 made a dead letter of
    # 760 KB, 16,000 one of 8 MB and held the event loop 57 s (18 s before: the reason's copies)
    crawler = get_crawler(ManyUnstorableChildrenSpider, settings(redis_url, LOG_LEVEL="ERROR"))
    await crawler.crawl_async(base_url=site.url)
    assert crawler.stats.get_value("ha/unstorable") == 3000
    (raw,) = redis_client.hgetall(Keys("ha", "many_unstorable").dead_info).values()
    reason = json.loads(raw)["reason"]
    assert reason.startswith(f"child {site.url}/item/0: "), reason[:200]
    assert f"; child {site.url}/item/1: " in reason
    assert len(reason) <= UNSTORABLE_REASON_CHARS + 100, len(reason)
    assert reason.endswith("and more (ha/unstorable counts them, each in an ERROR line)")


class UnstorableStartSpider(CatalogueSpider):
    name = "unstorable_start"

    async def start(self) -> Any:
        yield scrapy.Request(
            self.start_urls[0].replace("/list/1", "/item/1"),
            callback=self.parse_item,
            meta={"handle": open_file()},
        )
        yield scrapy.Request(
            self.start_urls[0].replace("/list/1", "/item/2"), callback=self.parse_item
        )


@deferred_f_from_coro_f
async def test_an_unstorable_start_request_costs_only_itself(redis_url, site, caplog):
    crawler = get_crawler(UnstorableStartSpider, settings(redis_url))
    await crawler.crawl_async(base_url=site.url)
    stats = crawler.stats.get_stats()
    assert [i["id"] for i in crawler.spider.items] == [2]
    assert stats["finish_reason"] == "finished"
    assert stats["ha/unstorable"] == 1
    assert "Cannot store" in caplog.text and "/item/1" in caplog.text


@deferred_f_from_coro_f
async def test_drop_key_stores_the_child_without_the_value(redis_url, site):
    crawler = get_crawler(UnstorableChildSpider, settings(redis_url, HA_UNSTORABLE="drop-key"))
    await crawler.crawl_async(base_url=site.url)
    assert sorted(i["id"] for i in crawler.spider.items) == list(range(1, 51))
    assert "ha/unstorable" not in crawler.stats.get_stats()


@deferred_f_from_coro_f
async def test_len_and_pending_answer_for_the_crawl_right_after_open(
    redis_url, redis_client, site, caplog
):
    from scrapy.utils.defer import maybe_deferred_to_future

    seeded = get_crawler(
        CatalogueSpider, settings(redis_url, SCHEDULER_PERSIST=True, CLOSESPIDER_PAGECOUNT=1)
    )
    await seeded.crawl_async(base_url=site.url)  # the first list page: its children are left
    left = backqueues.count(redis_client, Keys("ha", "catalogue"))
    assert left > 0
    crawler = get_crawler(CatalogueSpider, settings(redis_url, SCHEDULER_PERSIST=True))
    crawler.spider = crawler._create_spider(base_url=site.url)
    scheduler = Scheduler.from_crawler(crawler)
    with caplog.at_level(logging.INFO):
        await maybe_deferred_to_future(scheduler.open(crawler.spider))
    try:
        assert scheduler.has_pending_requests()
        assert len(scheduler) == left
        assert f"Joining a crawl already in Redis: {left} pending, 0 leased" in caplog.text
    finally:
        scheduler.session.stopping = True
        await maybe_deferred_to_future(scheduler.close("shutdown"))


class RecordingScheduler(Scheduler):
    """Records what the engine was handed, and when the urgent request arrived."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handed: list[scrapy.Request] = []
        self.urgent_at: int | None = None
        self.buffered_then = 0  # leased requests waiting in the buffer when it came

    def enqueue_request(self, request: scrapy.Request) -> bool:
        if request.priority == URGENT and self.urgent_at is None:
            self.urgent_at = len(self.handed)
            self.buffered_then = self.buffered()
        return super().enqueue_request(request)

    def next_request(self) -> scrapy.Request | None:
        request = super().next_request()
        if request is not None:
            self.handed.append(request)
        return request


URGENT = 100


class UrgentSpider(CatalogueSpider):
    """All list pages at once (a deep queue), then one priority-100 request mid-crawl."""

    name = "urgent"

    async def start(self) -> Any:
        for page in range(1, 9):
            yield scrapy.Request(self.start_urls[0].replace("/list/1", f"/list/{page}"))

    def parse(self, response: Any) -> Any:
        for href in response.css("a.item::attr(href)").getall():
            yield response.follow(href, callback=self.parse_item)

    def parse_item(self, response: Any) -> Any:
        yield from super().parse_item(response)
        if self.urgent_now(response):
            yield response.follow("/item/1?urgent", callback=self.parse_item, priority=URGENT)

    def urgent_now(self, response: Any) -> bool:
        return bool(response.url.endswith("/item/20"))


class UrgentBehindLeasesSpider(UrgentSpider):
    """The priority-100 request comes once at least 3 leased requests wait in the buffer."""

    name = "urgent_behind_leases"
    sent = False

    def urgent_now(self, response: Any) -> bool:
        scheduler = scheduler_for(self.crawler)
        if self.sent or scheduler is None or scheduler.buffered() < 3:
            return False
        self.sent = True
        return True


@pytest.mark.parametrize(
    ("spider", "order", "concurrency"),
    [(UrgentSpider, "lifo", 16), (UrgentBehindLeasesSpider, "fifo", 4)],
)
@deferred_f_from_coro_f
async def test_a_higher_priority_request_overtakes_the_buffer(
    redis_url, site_factory, spider, order, concurrency
):
    """In FIFO the item requests go to Redis and come back leased: the urgent one comes
    when the buffer holds some (LIFO keeps a lone worker's new requests, mostly out of it)."""
    site = site_factory("--pages", "8", "--per-page", "10", "--delay", "0.05")
    crawler = get_crawler(
        spider,
        settings(
            redis_url,
            SCHEDULER="tests.test_scheduler_semantics.RecordingScheduler",
            CONCURRENT_REQUESTS=concurrency,
            CONCURRENT_REQUESTS_PER_DOMAIN=concurrency,
            HA_QUEUE_ORDER=order,
        ),
    )
    await crawler.crawl_async(base_url=site.url)
    scheduler = scheduler_for(crawler)
    assert isinstance(scheduler, RecordingScheduler) and scheduler.urgent_at is not None
    urls = [r.url for r in scheduler.handed]
    position = urls.index(site.url + "/item/1?urgent")
    assert urls[scheduler.urgent_at : position] == []  # nothing handed out in between
    assert len(crawler.spider.items) == 81
    if order == "fifo":
        assert scheduler.buffered_then >= 3  # what it overtook


class RepeatSpider(CatalogueSpider):
    """The same detail page yielded three times (no dont_filter)."""

    name = "repeat"

    def parse(self, response: Any) -> Any:
        for _ in range(3):
            yield response.follow("/item/1", callback=self.parse_item)


@pytest.mark.parametrize(
    ("dupefilter", "fetched", "filtered"),
    [
        ("scrapy.dupefilters.RFPDupeFilter", 1, 2),
        ("scrapy.dupefilters.BaseDupeFilter", 3, None),
    ],
)
@deferred_f_from_coro_f
async def test_dupefilter_class_is_honoured(redis_url, site, caplog, dupefilter, fetched, filtered):
    crawler = get_crawler(
        RepeatSpider,
        settings(
            redis_url,
            DUPEFILTER_CLASS=dupefilter,
            DUPEFILTER_DEBUG=True,
            LOG_LEVEL="DEBUG",
        ),
    )
    with caplog.at_level(logging.DEBUG):
        await crawler.crawl_async(base_url=site.url)
    assert site.hits().get("/item/1") == fetched
    assert crawler.stats.get_value("dupefilter/filtered") == filtered
    assert caplog.text.count("Filtered duplicate request") == (filtered or 0)


class RepeatedStartSpider(CatalogueSpider):
    """The same start URL three times: Spider.start() makes them dont_filter requests."""

    name = "repeated_start"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self.start_urls = [base_url + "/item/1"] * 3

    def parse(self, response: Any) -> Any:
        return self.parse_item(response)


@deferred_f_from_coro_f
async def test_start_requests_repeated_on_purpose_are_crawled_once_per_crawl(redis_url, site):
    import asyncio

    crawlers = [get_crawler(RepeatedStartSpider, settings(redis_url)) for _ in range(2)]
    await asyncio.gather(*(c.crawl_async(base_url=site.url) for c in crawlers))
    assert site.hits().get("/item/1") == 3  # three on purpose; the second worker adds none


@deferred_f_from_coro_f
async def test_a_worker_forgets_its_start_requests_once_start_is_read(redis_url, site):
    """What a worker remembers to number repeated start requests is dropped once start() is
    read to its end (about 90 bytes a start request, for the life of the crawl otherwise)."""
    crawler = get_crawler(CatalogueSpider, settings(redis_url))
    remembered: list[int] = []

    def scraped() -> None:  # an item of a child page: start() was read before its parent
        scheduler = scheduler_for(crawler)
        assert scheduler is not None
        remembered.append(len(scheduler.admission._starts))

    crawler.signals.connect(scraped, signals.item_scraped)
    await crawler.crawl_async(base_url=site.url)
    assert remembered and set(remembered) == {0}


@deferred_f_from_coro_f
async def test_a_persisted_finished_crawl_runs_again_from_its_start_requests(
    redis_url, site, caplog
):
    first = get_crawler(CatalogueSpider, settings(redis_url, SCHEDULER_PERSIST=True))
    await first.crawl_async(base_url=site.url)
    again = get_crawler(CatalogueSpider, settings(redis_url, SCHEDULER_PERSIST=True))
    with caplog.at_level(logging.INFO):
        await again.crawl_async(base_url=site.url)
    assert site.hits()["/list/1"] == 2  # the start request, again
    assert again.spider.items == []  # what it links to was seen in run 1
    assert "Run 2 of the crawl of catalogue" in caplog.text
    assert "scrapy-ha flush catalogue" in caplog.text


#: Seconds the site waits before each answer in the one-by-one test: long against the time a
#: worker takes to send its next request, so that two requests at once cannot look sequential.
ANSWER_DELAY = 0.2


@deferred_f_from_coro_f
async def test_one_request_per_domain_is_downloaded_one_by_one(
    redis_url: str, site_factory: type[Site]
) -> None:
    """With CONCURRENT_REQUESTS_PER_DOMAIN=1 a request of a busy slot waits in the buffer (where
    another worker could have it), so the site sees one request of the worker at a time: each
    arrives after the answer to the one before, which the site sends ANSWER_DELAY after it."""
    site = site_factory("--pages", "1", "--per-page", "6", "--delay", str(ANSWER_DELAY))
    crawler = get_crawler(CatalogueSpider, settings(redis_url, CONCURRENT_REQUESTS_PER_DOMAIN=1))
    await crawler.crawl_async(base_url=site.url)
    arrivals = sorted(entry[0] for entry in site.log())
    assert len(arrivals) == 1 + 6  # the list page and its items
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(arrivals)]
    assert min(gaps) >= ANSWER_DELAY, f"seconds between requests at the site: {gaps}"


@deferred_f_from_coro_f
async def test_a_small_one_domain_crawl_spreads_over_two_workers(redis_url, site_factory):
    import asyncio

    site = site_factory("--pages", "2", "--per-page", "10", "--delay", "0.05")
    worker = settings(redis_url, CONCURRENT_REQUESTS_PER_DOMAIN=1)  # startproject's template
    crawlers = [get_crawler(CatalogueSpider, worker) for _ in range(2)]
    await asyncio.gather(*(c.crawl_async(base_url=site.url) for c in crawlers))
    counts = [len(c.spider.items) for c in crawlers]
    assert sum(counts) == 20
    assert min(counts) >= 5, f"items per worker: {counts}"


@deferred_f_from_coro_f
async def test_a_crawl_that_ends_while_a_killed_workers_heartbeat_lives_is_still_cleared(
    redis_url, redis_client, site, caplog
):
    """A worker SIGKILLed shortly before the end leaves its heartbeat live for up to
    HA_HEARTBEAT_TTL: the last worker waits it out and clears the crawl
    (SCHEDULER_PERSIST=False), so the next run crawls everything again, not nothing."""
    keys = Keys("ha", "catalogue")

    def killed_lately() -> None:  # as the crawl ends: its heartbeat outlives the close budget
        seconds, micros = redis_client.time()
        expiry = seconds * 1000 + micros // 1000 + 4000
        redis_client.zadd(keys.workers, {"killed-lately": expiry})

    first = get_crawler(CatalogueSpider, settings(redis_url, HA_CLOSE_TIMEOUT=1))
    first.signals.connect(killed_lately, signals.spider_idle)
    with caplog.at_level(logging.INFO):
        await first.crawl_async(base_url=site.url)
    assert "1 other worker(s) have a live heartbeat" in caplog.text
    again = get_crawler(CatalogueSpider, settings(redis_url))
    await again.crawl_async(base_url=site.url)
    assert first.spider.items and len(again.spider.items) == len(first.spider.items)
    assert not redis_client.exists(keys.dupefilter, keys.workers)
    assert "cleared its working keys" in caplog.text


@deferred_f_from_coro_f
async def test_of_two_workers_ending_together_one_ends_the_crawl_the_other_at_once(
    redis_url, site_factory, caplog
):
    """The first to close sees the other's heartbeat: it leaves the crawl to it once that
    one leaves (before, it waited and cleared the cleared crawl again)."""
    import asyncio

    site = site_factory("--pages", "2", "--per-page", "10", "--delay", "0.05")
    crawlers = [get_crawler(CatalogueSpider, settings(redis_url)) for _ in range(2)]
    with caplog.at_level(logging.INFO):
        await asyncio.gather(*(c.crawl_async(base_url=site.url) for c in crawlers))
    assert sum(len(c.spider.items) for c in crawlers) == 20
    assert caplog.text.count("Crawl finished: cleared its working keys") == 1
    assert "Stopped waiting" not in caplog.text
