"""Runs of a crawl: a persisted crawl started again seeds its start requests again, once
however many workers start it, and filters what it saw (store/runs.py, lua/run.lua)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.keys import Keys
from scrapy_ha.store.join import join_crawl
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.runs import Run, end_run, open_run, read_run
from scrapy_ha.store.wire import NewEntry
from tests.spiders import CatalogueSpider

KEYS = Keys("ha", "s")
HEARTBEAT_MS = 30_000


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


def settings(redis_url: str, **extra):
    return {
        "ADDONS": {"scrapy_ha.Addon": 0},
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.3,
        "SCHEDULER_PERSIST": True,
        "LOG_LEVEL": "INFO",
        **extra,
    }


@deferred_f_from_coro_f
async def test_a_run_starts_on_an_empty_crawl_whose_last_run_ended(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    assert await open_run(q, "a", HEARTBEAT_MS) == Run(1, True)
    assert await open_run(q, "b", HEARTBEAT_MS) == Run(1, False)  # a is alive: its run
    await q.enqueue([NewEntry(b"fp1", 0, b"payload")])
    assert not await end_run(q)  # a request is pending: the run goes on
    assert await open_run(q, "c", HEARTBEAT_MS) == Run(1, False)
    (lease,) = await q.lease(1, 30_000)
    assert await open_run(q, "d", HEARTBEAT_MS) == Run(1, False)  # leased: still run 1
    await q.ack([(lease.id, lease.token)])
    assert await end_run(q)
    # a, b, c, d are alive, but run 1 ended: the next worker starts run 2, the others join it
    assert await open_run(q, "e", HEARTBEAT_MS) == Run(2, True)
    assert await open_run(q, "a", HEARTBEAT_MS) == Run(2, False)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_run_whose_workers_all_died_is_over_once_their_heartbeats_expire(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    assert await open_run(q, "a", 300) == Run(1, True)  # then killed: no end_run
    assert await open_run(q, "b", HEARTBEAT_MS) == Run(1, False)  # a may still be seeding
    await q.client.zrem(KEYS.workers, "b")  # b was killed too
    await asyncio.sleep(0.4)  # a's heartbeat expired
    assert await open_run(q, "c", HEARTBEAT_MS) == Run(2, True)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_two_workers_restarted_together_on_a_run_whose_workers_died_start_the_next(
    redis_url,
):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    assert await open_run(q, "a", 300) == Run(1, True)  # then killed at the run's end
    await asyncio.sleep(0.4)  # its heartbeat expired
    for worker in ("c", "d"):  # both join the crawl (registered, join.lua) before their run
        await join_crawl(q.client, "ha", "s", shards=1, worker=worker, registration_ms=HEARTBEAT_MS)
    assert await open_run(q, "c", HEARTBEAT_MS) == Run(2, True)  # d is alive, not of run 1
    assert await open_run(q, "d", HEARTBEAT_MS) == Run(2, False)  # c is of run 2: its run
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_crawl_written_before_runs_were_kept_is_in_run_1(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    await q.enqueue([NewEntry(b"fp1", 0, b"payload")])
    assert await open_run(q, "a", HEARTBEAT_MS) == Run(1, False)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_two_workers_rerun_a_persisted_crawl_seeding_it_once(redis_url, site, caplog):
    first = get_crawler(CatalogueSpider, settings(redis_url))
    await first.crawl_async(base_url=site.url)
    assert len(first.spider.items) > 0
    assert site.hits()["/list/1"] == 1
    crawlers = [get_crawler(CatalogueSpider, settings(redis_url)) for _ in range(2)]
    with caplog.at_level(logging.INFO):
        await asyncio.gather(*(c.crawl_async(base_url=site.url) for c in crawlers))
    assert site.hits()["/list/1"] == 2  # once more in run 2, by one of the two workers
    assert [c.spider.items for c in crawlers] == [[], []]  # every item page was seen in run 1
    assert "Run 2 of the crawl of catalogue" in caplog.text
    third = get_crawler(CatalogueSpider, settings(redis_url))
    await third.crawl_async(base_url=site.url)
    assert site.hits()["/list/1"] == 3


@deferred_f_from_coro_f
async def test_the_status_says_which_run_and_that_its_totals_count_every_run(redis_url):
    """A persisted crawl started again showed totals that grew over its runs and nothing
    said so: a user who re-ran it read the earlier runs' pages as this run's."""
    from tests.test_dlq import cli  # noqa: PLC0415

    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    assert await open_run(q, "a", HEARTBEAT_MS) == Run(1, True)
    await q.enqueue([NewEntry(b"fp1", 0, b"payload")])
    (lease,) = await q.lease(1, 30_000)
    await q.ack([(lease.id, lease.token)])
    assert await end_run(q)
    first = json.loads(cli(redis_url, "status", "s", "--json").stdout)["run"]
    assert (first["number"], first["open"]) == (1, False) and first["ended"] >= first["started"]
    assert await open_run(q, "b", HEARTBEAT_MS) == Run(2, True)
    shown = cli(redis_url, "status", "s")
    assert shown.returncode == 0, shown.stderr
    line = next(x for x in shown.stdout.splitlines() if x.strip().startswith("run "))
    assert "run  2, begun " in line and "totals count runs 1 to 2" in line, line
    second = json.loads(cli(redis_url, "status", "s", "--json").stdout)["run"]
    assert (second["number"], second["open"]) == (2, True) and second["ended"] is None
    await q.client.hset(KEYS.run, "started", "garbage")  # written by hand: still a status
    assert cli(redis_url, "status", "s").returncode == 0
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_requeue_after_the_crawl_was_cleared_says_what_the_next_worker_crawls(
    redis_url, site_factory
):
    """A QA run: with ``SCHEDULER_PERSIST = False`` a worker started after ``dlq requeue``
    on a finished crawl crawled the whole site again (its end cleared the dupefilter), the
    outbox storing every item twice, and nothing had said so. The requeue says it."""
    from tests.cli_seed import scrapy_ha

    requeue = ("dlq", "requeue", "catalogue", "--all", "--yes", "--redis-url", redis_url)
    for persist in (True, False):
        site = site_factory("--pages", "1", "--per-page", "3", "--fault", "404:3:1")
        crawler = get_crawler(CatalogueSpider, settings(redis_url, SCHEDULER_PERSIST=persist))
        await crawler.crawl_async(base_url=site.url)
        done = await asyncio.to_thread(scrapy_ha, *requeue)
        assert done.returncode == 0 and "requeued 1" in done.stdout, done.stderr
        said = "note: the crawl of catalogue finished and was cleared (SCHEDULER_PERSIST=False)"
        assert (said in done.stderr) == (not persist), done.stderr
        await asyncio.to_thread(scrapy_ha, "flush", "catalogue", "-y", "--redis-url", redis_url)


@deferred_f_from_coro_f
async def test_the_dashboards_requeue_says_it_too(redis_url, site_factory):
    """The dashboard's requeue says what ``dlq requeue`` says of a crawl its end cleared."""
    from tests.cli_seed import scrapy_ha
    from tests.test_dashboard_actions import _drive

    notes = []
    for persist in (True, False):
        site = site_factory("--pages", "1", "--per-page", "3", "--fault", "404:3:1")
        crawler = get_crawler(CatalogueSpider, settings(redis_url, SCHEDULER_PERSIST=persist))
        await crawler.crawl_async(base_url=site.url)

        def requeue(http: Any) -> None:
            done = http.post(
                "/api/crawls/catalogue/actions/requeue", json={"filter": {}, "all": True}
            ).json()
            assert done["touched"] == 1, done
            notes.append(done["note"])

        await asyncio.to_thread(_drive, redis_url, requeue)
        await asyncio.to_thread(scrapy_ha, "flush", "catalogue", "-y", "--redis-url", redis_url)
    kept, cleared = notes
    assert kept is None
    assert cleared.startswith("the crawl of catalogue finished and was cleared"), cleared


@deferred_f_from_coro_f
async def test_a_worker_that_resumes_an_ended_run_with_work_pushed_after_it_reopens_it(
    redis_url,
):
    """A QA run: requests pushed (or requeued) after the crawl finished, then a worker
    started; it joined the ended run (the crawl is not empty), and while it crawled the
    status said ``run 1, begun ..., ended ...`` (``"open": false``): the run in progress
    read as over. The worker that resumes the run opens it again."""
    from tests.test_dlq import cli  # noqa: PLC0415

    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    assert await open_run(q, "a", HEARTBEAT_MS) == Run(1, True)
    assert await end_run(q)
    await q.enqueue([NewEntry(b"fp1", 0, b"payload")])  # `scrapy-ha push` after the end
    assert await open_run(q, "b", HEARTBEAT_MS) == Run(1, False)  # resumes run 1: work left
    state = await read_run(q.client, KEYS)
    assert state is not None and state.open, state
    shown = json.loads(cli(redis_url, "status", "s", "--json").stdout)["run"]
    assert (shown["number"], shown["open"], shown["ended"]) == (1, True, None), shown
    (lease,) = await q.lease(1, 30_000)
    await q.ack([(lease.id, lease.token)])
    assert await end_run(q)  # and it ends again when the crawl is done
    state = await read_run(q.client, KEYS)
    assert state is not None and not state.open and state.ended is not None, state
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_run_ends_once_however_many_workers_close_on_it(redis_url):
    """Every worker that closes on the finished crawl asks to end its run: the first ends
    it, the others are told it was ended already (each logged "Run 1 of the crawl
    finished", and each moved its end to its own close)."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    assert await open_run(q, "a", HEARTBEAT_MS) == Run(1, True)
    assert await open_run(q, "b", HEARTBEAT_MS) == Run(1, False)
    assert await end_run(q)
    ended = await q.client.hget(KEYS.run, "ended")
    await asyncio.sleep(0.01)
    assert not await end_run(q)  # b closes next: run 1 ended already
    assert await q.client.hget(KEYS.run, "ended") == ended
    # work pushed after that end, crawled by b, which stayed (no join opens the run again):
    # b's close ends the run again, at its own time (a review)
    await q.enqueue([NewEntry(b"fp1", 0, b"payload")])
    (lease,) = await q.lease(1, 30_000)
    await q.ack([(lease.id, lease.token)])
    await asyncio.sleep(0.01)
    assert await end_run(q)
    assert int(await q.client.hget(KEYS.run, "ended")) > int(ended)
    assert not await end_run(q)
    await q.client.aclose()
