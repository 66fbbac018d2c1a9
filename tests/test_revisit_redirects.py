"""A revisited request that is redirected (scheduler/revisits.py ``Revisits.redirected``):
the revisits stay with the original, its target fetched in full at each of its visits and
not revisited on its own, whatever the redirect. Before, the target kept the original's
``ha_revisit`` (RedirectMiddleware copies the meta) and got a revisit entry of its own:
fetched at its own period and again at each of the original's visits, the second fetch
ending as a double."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.config.continuous import RevisitConfig
from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.inflight import _redirect_of
from scrapy_ha.scheduler.revisits import Revisits
from tests import backqueues
from tests import test_revisit_conditional as conditional
from tests.cli_seed import scrapy_ha
from tests.test_items_outbox import stream
from tests.test_revisit_conditional import KEYS, PagesSpider, settings, stop, until
from tests.test_revisit_failures import dead_ids, fail, statuses
from tests.test_revisits import CONTINUOUS, visits

pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")

changing_site = conditional.changing_site  # the fixture

INTERVAL = 1.0
ROOT = Path(__file__).parent


class RedirectedSpider(scrapy.Spider):
    """Two revisited start pages: one the site redirects with a 302, one with a 301."""

    name = "redirected"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base_url = base_url

    async def start(self) -> Any:
        for path in ("/redirect/3", "/moved/4"):
            meta = {"ha_revisit": INTERVAL}
            yield scrapy.Request(self.base_url + path, meta=meta, dont_filter=True)

    def parse(self, response: Any) -> Any:
        yield {"id": int(response.css("span.id::text").get())}


async def crawl_until(crawler: Any, site: Any, redis_url: str, enough: Any) -> None:
    """Crawl *site* until *enough* holds of its visits so far, then stop the crawl
    with ``scrapy-ha stop`` and wait for it to end."""
    crawling = asyncio.ensure_future(crawler.crawl_async(base_url=site.url))
    deadline = time.monotonic() + 60
    while not enough(visits(site)):
        assert not crawling.done(), "the crawl finished by itself"
        assert time.monotonic() < deadline, visits(site)
        await asyncio.sleep(0.2)
    name = crawler.spidercls.name
    stopped = await asyncio.to_thread(scrapy_ha, "stop", name, "--redis-url", redis_url)
    assert stopped.returncode == 0, stopped.stderr
    await asyncio.wait_for(crawling, 30)


@deferred_f_from_coro_f
async def test_a_redirected_revisit_is_fetched_once_a_period(redis_url, site, redis_client):
    settings = {**CONTINUOUS, "REDIS_URL": redis_url}
    crawler = get_crawler(RedirectedSpider, settings)
    await crawl_until(
        crawler, site, redis_url, lambda v: len(v["/redirect/3"]) >= 5 <= len(v["/moved/4"])
    )
    times = visits(site)
    # the target at each of the original's visits, and only then (before: its own
    # revisits too, about twice as many fetches)
    for original, target in (("/redirect/3", "/item/3"), ("/moved/4", "/item/4")):
        assert len(times[target]) in (len(times[original]), len(times[original]) - 1), times
    keys = Keys("ha", "redirected")
    entries = await asyncio.to_thread(redis_client.zcard, keys.delayed)
    entries += await asyncio.to_thread(backqueues.count, redis_client, keys)
    assert entries == 2  # one revisit entry each: /redirect/3's and /moved/4's
    stats = await asyncio.to_thread(redis_client.hgetall, keys.stats)
    assert b"revisit_double" not in stats


class ChainSpider(RedirectedSpider):
    """A revisited page redirected twice at each visit: a 302, then a 301 (moved for good)."""

    name = "chain"

    async def start(self) -> Any:
        meta = {"ha_revisit": INTERVAL}
        yield scrapy.Request(self.base_url + "/chain/4", meta=meta, dont_filter=True)


@deferred_f_from_coro_f
async def test_a_permanent_redirect_later_in_a_chain_is_counted_once_a_visit(
    redis_url, site, caplog
):
    """Before, only the chain's first redirect was looked at (the later ones are carried
    under the page's lease without it): a 301 after a 302 was never counted."""
    crawler = get_crawler(ChainSpider, {**CONTINUOUS, "REDIS_URL": redis_url})
    await crawl_until(crawler, site, redis_url, lambda v: len(v["/item/4"]) >= 3)
    times, moved = visits(site), crawler.stats.get_value("ha/revisit/moved", 0)
    # counted as its hop is followed, before the target's fetch: one a visit
    assert len(times["/item/4"]) <= moved <= len(times["/moved/4"]), (moved, times)
    said = [r.getMessage() for r in caplog.records if "redirects for good" in r.getMessage()]
    assert f"{site.url}/chain/4 is revisited, and {site.url}/moved/4 redirects" in said[0]


class SeenFirstSpider(RedirectedSpider):
    """The target of a 301 crawled as a plain page first: seen when the revisited
    original is redirected to it."""

    name = "seenfirst"

    async def start(self) -> Any:
        yield scrapy.Request(self.base_url + "/item/4")
        yield scrapy.Request(self.base_url + "/moved/4", meta={"ha_revisit": INTERVAL}, priority=-1)


@deferred_f_from_coro_f
async def test_a_revisit_redirected_to_a_page_seen_before_goes_on(redis_url, site):
    """A review's finding on the first version, which moved the revisits to a permanent
    redirect's target: a target refused as seen lost them, and the crawl finished."""
    crawler = get_crawler(SeenFirstSpider, {**CONTINUOUS, "REDIS_URL": redis_url})
    await crawl_until(crawler, site, redis_url, lambda v: len(v["/moved/4"]) >= 3)
    assert len(visits(site)["/item/4"]) >= 3  # fetched at each visit, never filtered


def test_the_target_leaves_the_originals_validators_and_is_not_revisited_alone():
    config = RevisitConfig(rules=())
    revisits = Revisits(config, lambda r: b"fp")
    original = scrapy.Request("http://a.test/old", meta={"ha_revisit": 60})
    headers = {"If-None-Match": '"v1"', "If-Modified-Since": "Mon, 30 Nov 2026 10:00:00 GMT"}
    target = original.replace(url="http://a.test/new", headers=headers)
    target.meta.update(redirect_urls=[original.url], redirect_times=1, redirect_reasons=[301])
    revisits.redirected(original, target)
    # before: a 304 to the original's validators, which drops the page (R10 of the review)
    assert b"If-None-Match" not in target.headers and b"If-Modified-Since" not in target.headers
    assert target.meta["ha_revisit"] is False and target.dont_filter


def test_a_child_with_its_pages_meta_copied_is_no_redirect_of_the_page():
    """Without the add-on no child is tagged with its page: one yielded with the meta of a
    page that was itself redirected carries the page's redirect_urls and lease."""
    page = scrapy.Request("http://a.test/new")
    page.meta.update(redirect_urls=["http://a.test/old"], redirect_times=1)
    child = scrapy.Request("http://a.test/item", meta=dict(page.meta))
    redirect = page.replace(url="http://a.test/newer")
    redirect.meta.update(redirect_urls=[*page.meta["redirect_urls"], page.url], redirect_times=2)
    assert not _redirect_of(child, page) and _redirect_of(redirect, page)


def test_permanent_redirects_are_said_once_and_counted(caplog):
    """Before: a WARNING for each revisited URL redirected for good, and a key per URL kept
    for the life of the process (the set of what was said)."""
    from scrapy_ha.scheduler import revisits as module

    crawler = get_crawler(scrapy.Spider)
    revisits = Revisits(RevisitConfig(rules=()), lambda r: b"fp", stats=crawler.stats)
    said = len(module._WARNED)
    caplog.set_level(logging.DEBUG, logger=module.__name__)
    for i in range(100):
        original = scrapy.Request(f"http://a.test/old/{i}", meta={"ha_revisit": 60})
        target = original.replace(url=f"http://a.test/new/{i}")
        target.meta.update(redirect_urls=[original.url], redirect_times=1, redirect_reasons=[301])
        revisits.redirected(original, target)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "/old/0 is revisited" in warnings[0].getMessage()
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 99
    assert len(module._WARNED) <= said + 1
    assert crawler.stats.get_value("ha/revisit/moved") == 100
    # the message says what is counted and how often it is said (before: "every such URL",
    # "said once at WARNING", when a URL counts at each visit and each worker says it)
    message = warnings[0].getMessage()
    assert "per visit" in message and "once per worker" in message, message
    again = scrapy.Request("http://a.test/old/0", meta={"ha_revisit": 60})
    target = again.replace(url="http://a.test/new/0")
    target.meta.update(redirect_urls=[again.url], redirect_times=1, redirect_reasons=[301])
    revisits.redirected(again, target)  # the same URL's next visit
    assert crawler.stats.get_value("ha/revisit/moved") == 101
    further = target.replace(url="http://a.test/newer/0")  # moved for good again
    further.meta.update(redirect_urls=[again.url, target.url], redirect_times=2)
    further.meta["redirect_reasons"] = [301, 308]
    revisits.redirected(again, further)  # the chain's second hop: the visit counted once
    assert crawler.stats.get_value("ha/revisit/moved") == 101
    # a page reached through a 301 whose link keeps that page's meta: its own 301 counts
    inherited = scrapy.Request("http://a.test/item", meta={"ha_revisit": 60})
    inherited.meta.update(redirect_urls=["http://a.test/x"], redirect_times=1)
    inherited.meta["redirect_reasons"] = [301]
    target = inherited.replace(url="http://a.test/item/new")
    target.meta.update(redirect_urls=["http://a.test/x", inherited.url], redirect_times=2)
    target.meta["redirect_reasons"] = [301, 301]
    revisits.redirected(inherited, target)
    assert crawler.stats.get_value("ha/revisit/moved") == 102


@deferred_f_from_coro_f
async def test_a_revisit_redirected_to_a_missing_page_is_dead_lettered_once(
    redis_url, redis_client, changing_site
):
    """A revisited page removed, and redirected (302) to a page that answers 404: the target
    is carried under the page's lease (scheduler/carry.py), and each visit ends as a failed
    visit of the page, dead-lettered once at its ``HA_REVISIT_MAX_FAILURES``-th. Before,
    the target was stored as a child at each visit and dead-lettered at once (one dead
    letter a visit, for ever), and the page's visit ended as one that did not fail."""
    base = changing_site("--static")
    crawler = get_crawler(PagesSpider, settings(redis_url, HA_REVISIT_MAX_FAILURES=3))
    crawling = asyncio.ensure_future(crawler.crawl_async(base_url=base))
    await until(lambda: len(statuses(base, 0)) >= 2, "a revisit of page 0", crawling)
    await fail(base, 0, 302)
    await until(lambda: dead_ids(redis_client), "a dead letter", crawling)
    await asyncio.sleep(2 * INTERVAL)  # no other dead letter follows
    await stop(crawling, redis_client)
    assert statuses(base, 0).count(302) == 3  # (before: 1, and a dead letter of /gone/0)
    (entry,) = dead_ids(redis_client)
    assert json.loads(redis_client.hget(KEYS.payload, entry))["u"] == f"{base}/p/0"
    record = json.loads(redis_client.hget(KEYS.dead_info, entry))
    assert record["class"] == "gone", record
    assert "404" in record["reason"] and "3 failed visits in a row" in record["reason"], record
    # the three pages: no child stored (where a page's payload is, the payload hash or its
    # back queue, depends on whether it was due when the crawl stopped: not counted there)
    assert redis_client.hget(KEYS.stats, "enqueued") == b"3"
    assert crawler.stats.get_value("ha/revisit/failed_visits") == 2


@deferred_f_from_coro_f
async def test_a_revisit_redirected_to_a_page_stores_no_child(redis_url, site, redis_client):
    """The target of a revisited page's redirect is fetched at each visit under the page's
    lease: nothing of it reaches Redis (before, a child entry stored and acked a visit)."""
    settings = {**CONTINUOUS, "REDIS_URL": redis_url}
    crawler = get_crawler(RedirectedSpider, settings)
    await crawl_until(crawler, site, redis_url, lambda v: len(v["/redirect/3"]) >= 3)
    stats = await asyncio.to_thread(redis_client.hgetall, Keys("ha", "redirected").stats)
    assert stats[b"enqueued"] == b"2", stats  # the two start pages: no child (before: one a visit)
    assert crawler.stats.get_value("ha/revisit/scheduled") >= 4
    assert len(visits(site)["/item/3"]) >= 3


class FlakyTargetSpider(RedirectedSpider):
    """A revisited page redirected to a page that answers 503 to its first two hits."""

    name = "flakytarget"

    async def start(self) -> Any:
        meta = {"ha_revisit": INTERVAL}
        yield scrapy.Request(self.base_url + "/redirect/7", meta=meta, dont_filter=True)


async def _crawl_flaky_target(redis_url, site, **extra: Any) -> Any:
    """Crawl FlakyTargetSpider until /redirect/7 was fetched 4 times, or dead-lettered."""
    keys = Keys("ha", "flakytarget")
    settings = {**CONTINUOUS, "REDIS_URL": redis_url, "HA_RETRY_BACKOFF_BASE": 0.2, **extra}
    crawler = get_crawler(FlakyTargetSpider, settings)
    dead = lambda: crawler.stats.get_value("ha/dead/server")  # noqa: E731
    await crawl_until(crawler, site, redis_url, lambda v: len(v["/redirect/7"]) >= 4 or dead())
    return crawler, keys


@deferred_f_from_coro_f
async def test_a_retried_target_retries_its_revisited_page(redis_url, site_factory, redis_client):
    """The target's 503s are retries of the page (its entry to the delayed set, its URL the
    page's), then the visits go on. Before, the target was a child of its own, retried."""
    site = site_factory("--pages", "5", "--per-page", "10", "--fault", "503:7:2")
    crawler, keys = await _crawl_flaky_target(redis_url, site)
    assert len(visits(site)["/item/7"]) == len(visits(site)["/redirect/7"])  # one each visit
    assert crawler.stats.get_value("ha/retry/delayed") == 2
    assert crawler.stats.get_value("ha/revisit/scheduled") >= 1
    stats = await asyncio.to_thread(redis_client.hgetall, keys.stats)
    assert stats[b"enqueued"] == b"1", stats  # the page alone (before: the target too)
    # its payload: in the payload hash while leased or delayed, in its back queue while
    # pending (where it is when the crawl stops depends on the timing)
    queued = [payload for _, payload in backqueues.pending(redis_client, keys)]
    (payload,) = redis_client.hvals(keys.payload) + queued
    assert json.loads(payload)["u"] == site.url + "/redirect/7"
    assert not await asyncio.to_thread(redis_client.hlen, keys.dead_info)


@deferred_f_from_coro_f
async def test_a_target_counts_its_retries_against_its_page(redis_url, site_factory, redis_client):
    """One retry allowed: the target's second 503 spends the page's budget, and its first
    visit failing, the page is dead-lettered (a broken link), with the target's reason."""
    site = site_factory("--pages", "5", "--per-page", "10", "--fault", "503:7:2")
    crawler, keys = await _crawl_flaky_target(redis_url, site, HA_RETRY_TIMES=1)
    assert len(visits(site)["/item/7"]) == len(visits(site)["/redirect/7"]) == 2
    (entry,) = await asyncio.to_thread(redis_client.hkeys, keys.dead_info)
    payload = await asyncio.to_thread(redis_client.hget, keys.payload, entry)
    assert json.loads(payload)["u"] == site.url + "/redirect/7"
    record = json.loads(await asyncio.to_thread(redis_client.hget, keys.dead_info, entry))
    assert record["class"] == "server" and "503" in record["reason"], record
    assert len(record["history"]) == 2  # both attempts, of the target


@deferred_f_from_coro_f
async def test_a_carried_targets_items_commit_with_its_pages_visit(redis_url, site):
    """HA_ITEMS = "outbox": the target's item is held under the page's lease and committed
    with the end of the page's visit: once, as the target's page does not change (none
    lost, none twice; before the target was told against its page, once a visit)."""
    settings = {**CONTINUOUS, "REDIS_URL": redis_url, "HA_ITEMS": "outbox"}
    crawler = get_crawler(RedirectedSpider, settings)
    await crawl_until(crawler, site, redis_url, lambda v: len(v["/item/3"]) >= 3)
    ids = [item["id"] for item in await asyncio.to_thread(stream, redis_url, "redirected")]
    assert sorted(ids) == [3, 4], (ids, visits(site))
    assert crawler.stats.get_value("ha/items/committed") == len(ids)


def _worker(redis_url: str, site_url: str, log: Path, *, hang: bool) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "scrapy.cmdline", "runspider", str(ROOT / "carried_spider.py")]
    args += [
        "-a",
        f"base_url={site_url}",
        "-a",
        f"hang={int(hang)}",
        "-s",
        f"REDIS_URL={redis_url}",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT.parent)}
    with log.open("wb") as out:
        return subprocess.Popen(
            args, cwd=ROOT.parent, env=env, stdout=out, stderr=subprocess.STDOUT
        )


def test_a_worker_killed_with_a_carried_target_in_flight_loses_nothing(
    redis_url, site, redis_client, tmp_path
):
    """The target is nowhere in Redis: the page's lease alone holds the visit. Killed while
    the target's callback runs, the worker leaves that lease to expire; the next worker
    reclaims the page and visits it again, redirect and all, and the revisits go on."""
    victim = _worker(redis_url, site.url, tmp_path / "victim.log", hang=True)
    deadline = time.monotonic() + 60
    try:
        while b"TARGET IN FLIGHT" not in (tmp_path / "victim.log").read_bytes():
            assert victim.poll() is None, (tmp_path / "victim.log").read_text()[-3000:]
            assert time.monotonic() < deadline, visits(site)
            time.sleep(0.05)
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()
    keys = Keys("ha", "carried")
    assert redis_client.hget(keys.stats, "enqueued") == b"1"  # the page: no target stored
    killed_at = len(visits(site)["/redirect/3"])
    survivor = _worker(redis_url, site.url, tmp_path / "survivor.log", hang=False)
    try:
        while len(visits(site)["/redirect/3"]) < killed_at + 2:  # reclaimed, then revisited
            assert survivor.poll() is None, (tmp_path / "survivor.log").read_text()[-3000:]
            assert time.monotonic() < deadline + 30, visits(site)
            time.sleep(0.1)
        stopped = scrapy_ha("stop", "carried", "--redis-url", redis_url)
        assert stopped.returncode == 0, stopped.stderr
        assert survivor.wait(30) == 0, (tmp_path / "survivor.log").read_text()[-3000:]
    finally:
        if survivor.poll() is None:
            survivor.kill()
    assert len(visits(site)["/item/3"]) >= killed_at + 1  # its target fetched again
    entries = redis_client.zcard(keys.delayed) + backqueues.count(redis_client, keys)
    assert entries == 1 and not redis_client.hlen(keys.dead_info)
    assert redis_client.hget(keys.stats, "enqueued") == b"1"
    assert int(redis_client.hget(keys.stats, "reclaimed") or 0) == 1, redis_client.hgetall(
        keys.stats
    )


@deferred_f_from_coro_f
async def test_a_redirected_revisits_target_reaches_the_callback_only_when_changed(
    redis_url, redis_client, changing_site
):
    """Page 0, revisited, redirects (302) to itself under another URL (/v/0): the target's
    content is told against the page's last, so the callback sees it when it changed, not
    at every visit, and the page's visits count it. Before, the target reached the
    callback at each visit (its items yielded again), and each visit counted nothing."""
    base = changing_site("--static")
    crawler = get_crawler(PagesSpider, settings(redis_url))
    crawling = asyncio.ensure_future(crawler.crawl_async(base_url=base))
    await until(lambda: len(statuses(base, 0)) >= 2, "a revisit of page 0", crawling)
    await fail(base, 0, 302, to="/v/0")
    moved = lambda: statuses(base, 0).count(302)  # noqa: E731
    await until(lambda: moved() >= 3, "three redirected visits", crawling)
    await asyncio.to_thread(conditional.get, f"{base}/_change?page=0")
    await until(lambda: moved() >= 6, "three visits after the change", crawling)
    await stop(crawling, redis_client)
    spider = crawler.spider
    assert [v for page, v in spider.parsed if page == "0"] == ["version 0", "version 1"]
    unchanged = [(found, status) for page, found, status in spider.unchanged if page == "0"]
    assert unchanged.count(("unchanged", 200)) >= 3, unchanged  # the target's, told apart
    assert crawler.stats.get_value("ha/revisit/changed") == 1
    assert crawler.stats.get_value("ha/revisit/unchanged") >= 3


def test_a_targets_answer_keeps_no_validator_for_the_original_url():
    """The target's ETag and Last-Modified are its URL's: kept in the page's state, the
    next visit would send them to the original URL (whose own page, once it answers again,
    could be a 304 to another page's date)."""
    from scrapy.http import HtmlResponse

    from scrapy_ha import metakeys
    from scrapy_ha.revisit import RevisitMiddleware

    config = RevisitConfig(rules=())
    original = scrapy.Request("http://a.test/old", meta={"ha_revisit": 60})
    target = original.replace(url="http://a.test/new")
    target.meta.update(redirect_urls=[original.url], redirect_times=1, redirect_reasons=[302])
    Revisits(config, lambda r: b"fp").redirected(original, target)
    middleware = RevisitMiddleware(config)
    assert middleware.process_request(target) is None and not target.headers
    headers = {"ETag": '"t1"', "Last-Modified": "Mon, 30 Nov 2026 10:00:00 GMT"}
    response = HtmlResponse(target.url, body=b"<p>x</p>", headers=headers, request=target)
    assert middleware.process_response(target, response) is response
    found, answer = target.meta[metakeys.REVISIT_SEEN]
    assert found == "new" and answer.signature and not (answer.etag or answer.modified)


def test_a_child_that_copied_a_targets_meta_is_told_on_its_own():
    """A review's finding: a carried target's callback yielding a child with the target's
    meta copied (``meta={**response.meta}``) gave it the target's marker, so its first
    answer was told against another page's content (its callback skipped if equal)."""
    from scrapy_ha import metakeys
    from scrapy_ha.config.scheduler import SchedulerConfig
    from scrapy_ha.scheduler.inflight import InFlight
    from scrapy_ha.scheduler.outbox import Outbox

    crawler = get_crawler(scrapy.Spider, {"HA_REVISIT": {"/old": 60}})
    inflight = InFlight(crawler, Outbox(), SchedulerConfig.from_settings(crawler.settings))
    original = scrapy.Request("http://a.test/old", meta={metakeys.LEASE: ("7", "t")})
    inflight.add("7", "t", original, stored=False)
    target = original.replace(url="http://a.test/new")
    target.meta.update(redirect_urls=[original.url], redirect_times=1, redirect_reasons=[302])
    assert inflight.kin(target).carried and metakeys.REVISIT_TARGET in target.meta
    child = scrapy.Request("http://a.test/item", meta={**target.meta})
    child.meta.pop("redirect_urls")  # a link of the target's page, not a redirect
    inflight.kin(child)
    assert metakeys.REVISIT_TARGET not in child.meta  # (before: kept)
