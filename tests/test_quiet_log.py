"""The log says what happened, and nothing more: components that are off are silent, a
failure the spider's errback handled (an HTTP error or a download error) is not an ERROR, a
worker joining a crawl says how many of its start requests the crawl had seen, the retry history
names the worker."""

from __future__ import annotations

import json
import logging
import socket
from typing import Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.keys import Keys
from tests.spiders import FaultSpider

SETTINGS = {
    "ADDONS": {"scrapy_ha.Addon": 0},
    "HA_IDLE_TIMEOUT": 0.5,
    "HA_RETRY_JITTER": 0,
    "HA_RETRY_TIMES": 1,
    "HA_RETRY_BACKOFF_BASE": 0.2,
    "HA_WORKER_ID": "w-quiet",
    "LOG_LEVEL": "INFO",
}


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


def dead_infos(redis_client) -> list[dict]:
    return [json.loads(v) for v in redis_client.hgetall(Keys("ha", "faults").dead_info).values()]


@deferred_f_from_coro_f
async def test_off_components_and_handled_errors_log_no_warning_or_error(
    redis_url, redis_client, site, caplog
):
    caplog.set_level(logging.INFO)
    crawler = get_crawler(FaultSpider, {**SETTINGS, "REDIS_URL": redis_url})
    await crawler.crawl_async(base_url=site.url, paths=("/status/404",))
    assert crawler.spider.errors == ["/status/404"]  # the errback ran and did not raise
    disabled = [r.getMessage() for r in caplog.records if "Disabled" in r.getMessage()]
    assert disabled == []  # no proxy, no user agents, no checkpoints: nothing to say
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
    (info,) = dead_infos(redis_client)
    assert info["class"] == "gone" and info["errback"] is True


@deferred_f_from_coro_f
async def test_retry_history_names_the_worker_with_an_empty_buffer(redis_url, redis_client, site):
    crawler = get_crawler(FaultSpider, {**SETTINGS, "REDIS_URL": redis_url})
    await crawler.crawl_async(base_url=site.url, paths=("/flaky/1?fail=9&status=500",))
    (info,) = dead_infos(redis_client)  # one request: the buffer is empty at each retry
    assert [h["worker"] for h in info["history"]] == ["w-quiet", "w-quiet"]
    # its one retry lowered its priority by RETRY_PRIORITY_ADJUST (-1): from 1 to 0
    keys = Keys("ha", "faults")
    (payload,) = [
        json.loads(redis_client.hget(keys.payload, i)) for i in redis_client.hkeys(keys.dead_info)
    ]
    assert payload.get("p", 0) == 0


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed): connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ReRaisingFaultSpider(FaultSpider):
    """Its errback notes the failure and hands it back: the error is not handled."""

    def on_error(self, failure: Any) -> Any:
        super().on_error(failure)
        return failure


@deferred_f_from_coro_f
async def test_a_download_error_the_errback_handled_is_no_error(redis_url, redis_client, caplog):
    caplog.set_level(logging.INFO)
    crawler = get_crawler(FaultSpider, {**SETTINGS, "REDIS_URL": redis_url})
    base = f"http://127.0.0.1:{closed_port()}"
    await crawler.crawl_async(base_url=base, paths=("/item/1",))
    assert crawler.spider.errors == ["/item/1"]  # after its retry: the errback had its say
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
    (info,) = dead_infos(redis_client)
    assert info["class"] == "network" and info["errback"] is True


@deferred_f_from_coro_f
async def test_a_download_error_the_errback_handed_back_is_still_an_error(
    redis_url, redis_client, caplog
):
    caplog.set_level(logging.INFO)
    crawler = get_crawler(ReRaisingFaultSpider, {**SETTINGS, "REDIS_URL": redis_url})
    base = f"http://127.0.0.1:{closed_port()}"
    await crawler.crawl_async(base_url=base, paths=("/item/1",))
    assert crawler.spider.errors  # the errback ran
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(m.startswith("Dead-lettered") for m in errors)
    (info,) = dead_infos(redis_client)
    assert info["class"] == "network" and "errback" not in info


@deferred_f_from_coro_f
async def test_a_joining_worker_says_how_many_of_its_start_requests_were_seen(
    redis_url, site, caplog
):
    caplog.set_level(logging.INFO)
    paths = tuple(f"/item/{i}" for i in range(1, 11))
    first = {
        **SETTINGS,
        "REDIS_URL": redis_url,
        "HA_WORKER_ID": "w-first",
        "CONCURRENT_REQUESTS": 1,
        "CLOSESPIDER_PAGECOUNT": 1,  # stops early: the rest stays in Redis
    }
    await get_crawler(FaultSpider, first).crawl_async(base_url=site.url, paths=paths)
    caplog.clear()
    second = get_crawler(FaultSpider, {**SETTINGS, "REDIS_URL": redis_url})
    await second.crawl_async(base_url=site.url, paths=(*paths, "/item/11", "/item/12"))
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("Joining a crawl already in Redis") for m in messages)
    said = [m for m in messages if "start request(s) were already in the crawl" in m]
    assert said == [
        "10 of this worker's 12 start request(s) were already in the crawl (its shared "
        "dupefilter had seen them): not crawled again"
    ]
    assert second.stats.get_value("ha/start_filtered") == 10
    assert {"/item/11", "/item/12"} <= set(second.spider.ok)  # the new ones are crawled


class NoErrbackFaultSpider(FaultSpider):
    """Its requests have no errback: what the site answered is the crawl's to log."""

    async def start(self) -> Any:
        async for request in super().start():
            yield request.replace(errback=None)


@deferred_f_from_coro_f
async def test_a_page_the_site_says_is_gone_is_no_error(redis_url, redis_client, site, caplog):
    """A 404, a 410 or another 4xx is the site's answer, not the crawl's failure: Scrapy's
    HttpErrorMiddleware logs it at INFO ("Ignoring response"), and so does its dead letter,
    errback or not. A 5xx that its retries could not fix stays an ERROR, as Scrapy's own
    "Gave up retrying" is."""
    caplog.set_level(logging.INFO)
    crawler = get_crawler(NoErrbackFaultSpider, {**SETTINGS, "REDIS_URL": redis_url})
    paths = ("/status/404", "/status/410", "/status/400", "/flaky/1?fail=9&status=500")
    await crawler.crawl_async(base_url=site.url, paths=paths)
    classes = sorted(info["class"] for info in dead_infos(redis_client))
    assert classes == ["client", "gone", "gone", "server"]
    dead = {
        r.getMessage().split(" (class ")[1].split(")")[0]: r.levelname
        for r in caplog.records
        if r.getMessage().startswith("Dead-lettered")
    }
    assert dead == {"gone": "INFO", "client": "INFO", "server": "ERROR"}
    assert crawler.stats.get_value("ha/dead/gone") == 2


@deferred_f_from_coro_f
async def test_a_refused_connection_through_a_proxy_names_the_proxy(redis_url, redis_client, site):
    """A QA run: HA_PROXY_MODE = "tunnel" with nothing listening at the tunnel; every page
    was dead-lettered as the site's DownloadConnectionRefusedError, the proxy named nowhere.
    The reason names it now (host and port, never its credentials)."""
    port = closed_port()
    settings = {
        **SETTINGS,
        "REDIS_URL": redis_url,
        "HA_RETRY_TIMES": 0,
        "HA_PROXY_MODE": "tunnel",
        "HA_PROXY_URL": f"http://user:s3cret@127.0.0.1:{port}",
    }
    crawler = get_crawler(FaultSpider, settings)
    await crawler.crawl_async(base_url=site.url, paths=("/item/1",))
    (info,) = dead_infos(redis_client)
    assert info["class"] == "network", info
    assert info["reason"].endswith(f"(through proxy 127.0.0.1:{port})"), info
    assert "s3cret" not in json.dumps(info)
    redis_client.flushdb()
    crawler = get_crawler(FaultSpider, {**SETTINGS, "REDIS_URL": redis_url, "HA_RETRY_TIMES": 0})
    await crawler.crawl_async(base_url=f"http://127.0.0.1:{port}", paths=("/item/1",))
    (info,) = dead_infos(redis_client)  # no proxy: the error alone, as before
    assert info["class"] == "network" and "proxy" not in info["reason"], info
