"""The dead-letter webhook alert: one POST per threshold crossing per crawl, any number of
workers, received by a real local HTTP server."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.config.validate import ConfigError
from scrapy_ha.keys import Keys
from tests.spiders import FaultSpider
from tests.test_dlq import cli
from tests.test_retry_crawl import FAST_RETRIES

if TYPE_CHECKING:
    from collections.abc import Iterator


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


class Receiver:
    """An incoming webhook: records every JSON POST."""

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        received = self.posts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers["Content-Length"])
                received.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook/secret-token"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def settings(redis_url: str, webhook: str, threshold: int = 3) -> dict[str, Any]:
    return {
        **FAST_RETRIES,
        "REDIS_URL": redis_url,
        "HA_DLQ_ALERT_WEBHOOK": webhook,
        "HA_DLQ_ALERT_THRESHOLD": threshold,
    }


@deferred_f_from_coro_f
async def test_two_workers_send_one_alert_per_crossing(redis_url, redis_client, site, receiver):
    paths = tuple(f"/status/404?n={i}" for i in range(8))
    crawlers = [get_crawler(FaultSpider, settings(redis_url, receiver.url)) for _ in range(2)]
    await asyncio.gather(*(c.crawl_async(base_url=site.url, paths=paths) for c in crawlers))
    assert redis_client.zcard(Keys("ha", "faults").dead) == 8
    (post,) = receiver.posts  # one POST, though both workers passed the threshold
    # the size when the crossing was seen: another worker may have added one meanwhile
    assert post["spider"] == "faults" and post["dead"] >= 3 and post["threshold"] == 3
    assert "scrapy-ha dlq list faults" in post["text"]
    assert sum(c.stats.get_value("ha/alert/sent") or 0 for c in crawlers) == 1

    # below the threshold again (the operator purged): the next crossing alerts again
    assert cli(redis_url, "dlq", "purge", "faults", "--all", "--yes").returncode == 0
    more = tuple(f"/status/410?n={i}" for i in range(4))
    await get_crawler(FaultSpider, settings(redis_url, receiver.url)).crawl_async(
        base_url=site.url, paths=more
    )
    assert len(receiver.posts) == 2 and receiver.posts[1]["dead"] == 3  # one worker: exact


@deferred_f_from_coro_f
async def test_an_unreachable_webhook_costs_the_crawl_nothing(redis_url, site, caplog):
    from tests.conftest import free_port

    url = f"http://127.0.0.1:{free_port()}/hook/secret-token"  # nothing listens there
    paths = ("/status/404?a", "/status/404?b", "/item/1")
    crawler = get_crawler(FaultSpider, settings(redis_url, url, threshold=1))
    await crawler.crawl_async(base_url=site.url, paths=paths)
    assert crawler.stats.get_value("item_scraped_count") == 1
    assert crawler.stats.get_value("ha/dead/gone") == 2
    assert crawler.stats.get_value("ha/alert/errors") == 1
    assert "Could not send the dead-letter alert of faults" in caplog.text
    assert "secret-token" not in caplog.text  # a webhook's path is its secret


def test_the_webhook_must_be_an_http_url():
    from scrapy.settings import Settings
    from scrapy.statscollectors import MemoryStatsCollector

    from scrapy_ha.deadletters.alerts import DeadLetterAlert

    stats = MemoryStatsCollector(get_crawler(FaultSpider))
    with pytest.raises(ConfigError, match="HA_DLQ_ALERT_WEBHOOK='ftp://x' must be an http"):
        DeadLetterAlert.from_settings(Settings({"HA_DLQ_ALERT_WEBHOOK": "ftp://x"}), stats)
    with pytest.raises(ConfigError, match="HA_DLQ_ALERT_THRESHOLD"):
        DeadLetterAlert.from_settings(
            Settings({"HA_DLQ_ALERT_WEBHOOK": "http://x", "HA_DLQ_ALERT_THRESHOLD": 0}), stats
        )
