"""A worker hands out its own new requests at once, before Redis has them (issue 17, item 7).

``next_request()`` answers from memory: right after ``enqueue_request()`` it returns the
request (no round trip), so ``scheduler_empty`` does not fire while a request waits. The
next round stores such a request in Redis already leased to the worker; what comes of it
waits for that round, which alone knows whether another worker (or an earlier run) had it
(the early download of a GET meanwhile: tests/test_early_download.py).
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import TYPE_CHECKING, Any

import pytest
import scrapy
from scrapy import Request, Spider, signals
from scrapy.utils.defer import deferred_f_from_coro_f, maybe_deferred_to_future
from scrapy.utils.test import get_crawler

from scrapy_ha import metakeys
from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.admission import FINGERPRINT_BYTES
from scrapy_ha.scheduler.shell import Scheduler
from tests import backqueues

if TYPE_CHECKING:
    import redis

#: Seconds any poll of these tests waits before it fails (the machine is shared and slow).
DEADLINE = 30.0


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


def settings(redis_url: str, **extra: Any) -> dict[str, Any]:
    return {
        "SCHEDULER": "scrapy_ha.Scheduler",
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.3,
        "LOG_LEVEL": "INFO",
        **extra,
    }


async def poll(check: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not check():
        assert time.monotonic() < deadline, f"still not true after {DEADLINE} s: {what}"
        await asyncio.sleep(0.02)


@deferred_f_from_coro_f
async def test_a_new_request_is_handed_out_at_once_and_stored_leased_to_this_worker(
    redis_url, redis_client: redis.Redis
):
    crawler = get_crawler(Spider, settings(redis_url))
    scheduler = Scheduler.from_crawler(crawler)
    spider = Spider.from_crawler(crawler, name="fresh")
    await maybe_deferred_to_future(scheduler.open(spider))
    keys = Keys("ha", "fresh")
    try:
        urls = [f"http://a.example/{i}" for i in range(5)]
        for url in urls:
            assert scheduler.enqueue_request(Request(url))
        handed = []
        # no reactor turn in between: has_pending_requests() true means a request now
        while scheduler.has_pending_requests():
            request = scheduler.next_request()
            assert request is not None
            handed.append(request)
        assert sorted(r.url for r in handed) == sorted(urls)
        assert scheduler.next_request() is None
        assert len(scheduler) == 0

        # the next round stores each leased to this worker, under the lease it was handed with
        leases = {tuple(r.meta[metakeys.LEASE]) for r in handed}

        def stored() -> bool:
            held = redis_client.hgetall(keys.leases)
            return {(i.decode(), v.decode().split()[0]) for i, v in held.items()} == leases

        await poll(stored, "the handed-out requests are leased in Redis")
        assert backqueues.count(redis_client, keys) == 0
        assert redis_client.zcard(keys.leased) == len(urls)
        # (counted once the round's reply is read, after Redis wrote the leases)
        await poll(
            lambda: crawler.stats.get_value("ha/handed_fresh") == len(urls),
            "the handed-out requests are counted",
        )
    finally:
        await maybe_deferred_to_future(scheduler.close("shutdown"))
    # never downloaded (no engine here): released at close, nothing lost
    assert backqueues.count(redis_client, keys) == 5
    assert redis_client.zcard(keys.leased) == 0


class SeenSpider(scrapy.Spider):
    """One page, whose callback yields a request Redis already saw (an earlier run)."""

    name = "seen"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/item/1"]
        self.base_url = base_url
        self.errbacks: list[str] = []

    def parse(self, response: Any) -> Any:
        yield Request(self.base_url + "/item/2", callback=self.parse, errback=self.failed)

    def failed(self, failure: Any) -> None:
        self.errbacks.append(repr(failure.value))


@deferred_f_from_coro_f
async def test_a_duplicate_only_redis_knows_of_is_dropped_without_a_download(
    redis_url, redis_client: redis.Redis, site
):
    """Its download waits for the round's verdict; dropped as Scrapy drops a duplicate."""
    crawler = get_crawler(SeenSpider, settings(redis_url, SCHEDULER_PERSIST=True))
    seen = crawler.request_fingerprinter.fingerprint(Request(site.url + "/item/2"))
    redis_client.sadd(Keys("ha", "seen").dupefilter, seen[:FINGERPRINT_BYTES])
    dropped: list[str] = []

    def on_dropped(request: Request, spider: Spider) -> None:  # held here: signals hold weakly
        dropped.append(request.url)

    crawler.signals.connect(on_dropped, signal=signals.request_dropped)
    await crawler.crawl_async(base_url=site.url)
    stats = crawler.stats.get_stats()
    assert stats["finish_reason"] == "finished"
    assert site.hits().get("/item/2", 0) == 0
    assert dropped == [site.url + "/item/2"]
    assert crawler.spider.errbacks == []  # dropped, not failed
    assert stats["dupefilter/filtered"] == 1
    assert stats["ha/acked"] == 1
    assert stats.get("ha/stale_acks") is None


class SharedChildSpider(scrapy.Spider):
    """Each worker starts from its own page; both pages yield the same child."""

    name = "shared"

    def __init__(self, base_url: str = "", start: str = "1", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [f"{base_url}/item/{start}"]
        self.base_url = base_url

    def parse(self, response: Any) -> Any:
        if "/item/9" not in response.url:
            yield Request(self.base_url + "/item/9")


@deferred_f_from_coro_f
async def test_a_request_two_workers_yield_is_downloaded_once(redis_url, site):
    """Both workers hand their copy out at once; the round of the second to reach Redis
    finds a duplicate, and its gate drops the copy before the download."""
    workers = [get_crawler(SharedChildSpider, settings(redis_url)) for _ in range(2)]
    await asyncio.gather(
        workers[0].crawl_async(base_url=site.url, start="1"),
        workers[1].crawl_async(base_url=site.url, start="2"),
    )
    hits = site.hits()
    assert hits.get("/item/1") == hits.get("/item/2") == 1
    assert hits.get("/item/9") == 1
    stats = [w.stats.get_stats() for w in workers]
    assert [s["finish_reason"] for s in stats] == ["finished", "finished"]
    assert sum(s.get("ha/handed_fresh", 0) for s in stats) >= 3
    assert sum(s.get("dupefilter/filtered", 0) for s in stats) == 1


class LazySpider(scrapy.Spider):
    """The lazy start pattern of Scrapy's docs: yield the next start request only when the
    engine has room, waiting for ``scheduler_empty`` otherwise."""

    name = "lazy"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base_url = base_url
        self.empty_while_pending = 0

    async def start(self) -> Any:
        self.crawler.signals.connect(self._empty, signal=signals.scheduler_empty)
        for n in range(1, 6):
            if self.crawler.engine.needs_backout():
                await self.crawler.signals.wait_for(signals.scheduler_empty)
            yield Request(f"{self.base_url}/item/{n}")

    def _empty(self) -> None:
        if self.crawler.engine._slot.scheduler.has_pending_requests():
            self.empty_while_pending += 1

    def parse(self, response: Any) -> Any:
        return
        yield


@deferred_f_from_coro_f
async def test_scheduler_empty_does_not_fire_while_a_request_waits(redis_url, site):
    crawler = get_crawler(LazySpider, settings(redis_url, CONCURRENT_REQUESTS=1))
    await crawler.crawl_async(base_url=site.url)
    assert crawler.stats.get_value("finish_reason") == "finished"
    assert all(site.hits().get(f"/item/{n}") == 1 for n in range(1, 6))
    assert crawler.spider.empty_while_pending == 0


def test_a_worker_killed_right_after_a_hand_out_from_memory_loses_nothing(
    redis_url, redis_client: redis.Redis, site_factory, tmp_path
):
    """Redis holds every write (CLIENT PAUSE) while the victim hands out the children of a
    page from memory: they are in no Redis key when it is SIGKILLed. Its page was not acked
    (children before acks), so its lease expires and another worker redoes it."""
    from tests.test_crash import check_nothing_lost, worker  # noqa: PLC0415 (a sibling test module)

    pages, per_page = 3, 2
    site = site_factory(
        "--pages", str(pages), "--per-page", str(per_page), "--delay", "1", "--chains", "1"
    )
    items, log = tmp_path / "items.jl", tmp_path / "victim.log"
    victim = worker(redis_url, site.url, items, log, LOG_LEVEL="DEBUG")
    try:
        deadline = time.monotonic() + DEADLINE
        while not site.hits().get("/"):  # the start page was stored, and is downloading
            assert victim.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.01)
        redis_client.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")
        while log.read_text().count("before Redis has it") < 2:  # the page and a child
            assert victim.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.01)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
    finally:
        redis_client.execute_command("CLIENT", "UNPAUSE")
    assert len(site.hits()) == 1  # the child handed out never reached the site
    survivor = worker(redis_url, site.url, items, tmp_path / "survivor.log")
    assert survivor.wait(timeout=180) == 0, (tmp_path / "survivor.log").read_text()[-3000:]
    assert "'finish_reason': 'finished'" in (tmp_path / "survivor.log").read_text()
    check_nothing_lost(items, pages * per_page, site.hits(), bound=1)


class RedirectOnce(Spider):
    """A page that yields one request the site answers with a redirect."""

    name = "redirect_once"
    items: list[int]

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/list/1"]
        self.items = []

    def parse(self, response: Any) -> Any:
        yield response.follow("/redirect/3", callback=self.parse_item)

    def parse_item(self, response: Any) -> Any:
        self.items.append(int(response.css("span.id::text").get()))


@deferred_f_from_coro_f
async def test_a_redirect_of_a_request_handed_out_from_memory_keeps_its_lease(redis_url, site):
    """A request handed out from memory carries its own lease, and its redirect is fenced by
    it, not by the page that yielded it: that page is acked while the request waits in its
    download slot (DOWNLOAD_DELAY), and a redirect fenced by the acked page's lease would be
    refused and lost (a login chain of POST, 302, account page ended with no item)."""
    crawler = get_crawler(
        RedirectOnce,
        settings(
            redis_url,
            ADDONS={"scrapy_ha.Addon": 0},
            DOWNLOAD_DELAY=1,  # 0.5 to 1.5 s: the page is acked meanwhile (a round every 0.25 s)
        ),
    )
    await crawler.crawl_async(base_url=site.url)
    assert crawler.spider.items == [3]
    assert crawler.stats.get_value("ha/children_refused") is None
