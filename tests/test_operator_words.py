"""What a worker and ``scrapy-ha`` say when an operator steers a live crawl, in words an
operator reads (a QA run against real workers: a stop logged as a raw number of ms, a gate
opened early and a crawl's limits replaced without a word in any worker's log, and
``gates open`` of a domain with no gate saying "no gate was closed any more" while
another domain's gate was closed). Real redis-server."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from types import SimpleNamespace

import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.domains import ClosedDomains
from scrapy_ha.scheduler.session.control import STOPPED, Control
from scrapy_ha.store.gate_log import OPEN
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.state import set_domain_limits
from tests.cli_seed import _run, scrapy_ha

KEYS = Keys("ha", "steered")


@deferred_f_from_coro_f
async def test_a_stop_is_logged_with_its_local_time(redis_url, caplog):
    closed: list[str] = []

    async def close_spider_async(reason: str) -> None:
        closed.append(reason)

    crawler = SimpleNamespace(_engine=SimpleNamespace(close_spider_async=close_spider_async))
    queue = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    control = Control(crawler, SimpleNamespace(set_rules=lambda r: None), interval=10)  # type: ignore[arg-type]
    control.joined_ms = 1
    at = 1_796_547_439_028
    await queue.client.set(KEYS.stop, at)
    with caplog.at_level(logging.INFO, logger="scrapy_ha.scheduler.session.control"):
        await control.poll(queue)
        await asyncio.sleep(0)
    assert closed == [STOPPED]
    local = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at / 1000))
    assert f"Stopping: `scrapy-ha stop` asked at {local}" in caplog.text, caplog.text
    assert str(at) not in caplog.text
    await queue.client.aclose()


def test_a_gate_opened_before_its_time_is_logged_and_one_that_expired_is_not(caplog):
    closed = ClosedDomains()
    now = time.monotonic()
    closed.learn({"shop.test": now + 600, "slow.test": now + 0.01}, every=False)
    time.sleep(0.05)
    with caplog.at_level(logging.INFO, logger="scrapy_ha.scheduler.domains"):
        closed.learn({"shop.test": OPEN, "slow.test": OPEN}, every=False)  # gates open
    assert not closed
    assert re.search(r"Domain shop\.test opened for every worker \d+ s before", caplog.text)
    assert "slow.test" not in caplog.text  # its time had come: nobody opened it


@deferred_f_from_coro_f
async def test_a_worker_that_replaces_the_crawls_limits_says_so(redis_url, caplog):
    client = redis.asyncio.Redis.from_url(redis_url)
    limited = {"*": "0.0 1"}
    with caplog.at_level(logging.WARNING, logger="scrapy_ha.store.state"):
        await set_domain_limits(client, KEYS, limited)  # the first worker
        await set_domain_limits(client, KEYS, limited)  # another with the same settings
        assert not caplog.records
        await set_domain_limits(client, KEYS, {})  # one started without HA_DOMAIN_*
    assert not await client.exists(KEYS.domain_limits)
    (record,) = caplog.records
    assert "replace those in force for the crawl" in record.getMessage()
    assert "none, were every domain: concurrency 1" in record.getMessage()
    await client.aclose()


def test_gates_open_of_a_domain_without_a_gate_does_not_say_none_is_closed(redis_url):
    async def close() -> None:
        queue = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
        await queue.close_gate("shop.test", 600_000)
        await queue.client.aclose()

    _run(close())
    done = scrapy_ha("gates", "open", "steered", "other.test", "--yes", "--redis-url", redis_url)
    assert done.returncode == 1
    assert "no closed gate other.test in steered" in done.stderr
    assert "was closed any more" not in done.stdout
    assert "no gate of steered opened: other.test had none closed" in done.stdout, done.stdout
    listed = scrapy_ha("gates", "list", "steered", "--redis-url", redis_url)
    assert "shop.test" in listed.stdout  # still closed


def test_a_worker_says_when_seen_forget_changed_the_crawls_rules(caplog):
    from scrapy_ha.scheduler.admission import Admission
    from scrapy_ha.store.forget import rules_of

    admission = Admission(
        SimpleNamespace(),  # type: ignore[arg-type]
        dedupe=True,
        dedupe_start=True,
        debug=False,
        unstorable="error",
    )
    with caplog.at_level(logging.INFO, logger="scrapy_ha.scheduler.admission"):
        admission.set_rules(rules_of({}))  # no rule: nothing to say
        assert not caplog.records
        admission.set_rules(rules_of({b"v": b"2", b"p http://a.test/*": b"17"}))
        admission.set_rules(rules_of({b"v": b"2", b"p http://a.test/*": b"17"}))  # the same
    (record,) = caplog.records
    assert (
        "`scrapy-ha seen forget` changed what the crawl has seen (forget 2; 0 domain and 1 pattern"
        in record.getMessage()
    )


def test_a_forced_flush_says_what_the_live_workers_do(redis_url):
    from tests.test_metrics import live_crawl

    _run(live_crawl(redis_url))  # a live worker, w1
    refused = scrapy_ha("flush", "live", "--yes", "--redis-url", redis_url)
    assert refused.returncode == 1
    assert "stop them first (`scrapy-ha stop live`), or pass --force" in refused.stderr
    done = scrapy_ha("flush", "live", "--yes", "--force", "--redis-url", redis_url)
    assert done.returncode == 0, done.stderr
    assert "note: 1 live worker(s) now find the crawl empty" in done.stderr, done.stderr
    assert "finish reason finished" in done.stderr


def test_the_dashboard_says_stopped_not_finished_for_a_stopped_crawl_with_nothing_left(
    redis_url, redis_client
):
    """A QA run: a feed-mode crawl (``RedisSpider``) stopped with its queue empty read
    "finished" on the dashboard while ``status`` said "stopped" and its run was open."""
    from tests.test_dashboard_api import dashboard
    from tests.test_dashboard_pages import shown

    now = redis_client.time()[0] * 1000
    redis_client.hset("ha:{feeding}:run", mapping={"n": 1, "started": now - 5000, "open": 1})
    redis_client.hset("ha:{feeding}:stats", "acked", 60)
    assert scrapy_ha("stop", "feeding", "--redis-url", redis_url).returncode == 0
    with dashboard(redis_url) as http:
        (crawl,) = http.get("/api/crawls").json()["crawls"]
        assert crawl["stopped_at"] and not crawl["progress"]["left"], crawl
        for page in ("/", "/crawls/feeding"):
            parts = shown(http.get(page).text).parts
            assert "stopped" in parts and "finished" not in parts, (page, parts)
    redis_client.hset("ha:{feeding}:run", mapping={"open": 0, "ended": now + 60_000})
    with dashboard(redis_url) as http:  # its run ended after the stop: finished
        assert "finished" in shown(http.get("/crawls/feeding").text).parts
