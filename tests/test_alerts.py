"""The dead-letter webhook alert: one POST per threshold crossing per crawl, any number of
workers, received by a real local HTTP server."""

from __future__ import annotations

import asyncio
import json
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest
import redis.asyncio
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.config.validate import ConfigError
from scrapy_ha.deadletters.alerts import ALERT_TIMEOUT, PENDING_TTL, DeadLetterAlert
from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
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


@pytest.mark.parametrize("action", ["requeue", "purge"])
@deferred_f_from_coro_f
async def test_the_queue_taken_below_the_threshold_alerts_at_its_next_crossing(
    redis_url, redis_client, site, receiver, action
):
    """A QA run: two of four entries requeued (the queue at 2, below the threshold of 3)
    died again, the queue crossed the threshold again, and no alert came: a worker's check
    saw the queue only after a dead letter, at the threshold already."""
    dead = Keys("ha", "faults").dead
    paths = tuple(f"/status/404?n={i}" for i in range(4))
    await get_crawler(FaultSpider, settings(redis_url, receiver.url)).crawl_async(
        base_url=site.url, paths=paths
    )
    assert len(receiver.posts) == 1
    ids = [m.decode() for m in redis_client.zrange(dead, 0, 1)]
    assert cli(redis_url, "dlq", action, "faults", *ids, "--yes").returncode == 0
    assert redis_client.zcard(dead) == 2  # below the threshold
    more = ("/status/410?a",) if action == "purge" else ()  # the requeued ones die again
    await get_crawler(FaultSpider, settings(redis_url, receiver.url)).crawl_async(
        base_url=site.url, paths=more
    )
    assert redis_client.zcard(dead) == (3 if action == "purge" else 4)
    assert len(receiver.posts) == 2 and receiver.posts[1]["dead"] == 3


@deferred_f_from_coro_f
async def test_an_unreachable_webhook_costs_the_crawl_nothing(redis_url, site, caplog):
    from tests.conftest import free_port

    url = f"http://127.0.0.1:{free_port()}/hook/secret-token"  # nothing listens there
    paths = ("/status/404?a", "/status/404?b", "/item/1")
    crawler = get_crawler(FaultSpider, settings(redis_url, url, threshold=1))
    await crawler.crawl_async(base_url=site.url, paths=paths)
    assert crawler.stats.get_value("item_scraped_count") == 1
    assert crawler.stats.get_value("ha/dead/gone") == 2
    # a dead letter past the threshold tries again once the failed POST took its marker
    # back (one that came while the POST was under way does not): 1 or 2
    assert crawler.stats.get_value("ha/alert/errors") in (1, 2)
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


class FlakyReceiver(Receiver):
    """Answers 500 to the first *fail* POSTs (after *delay* seconds), then as Receiver."""

    def __init__(self, fail: int, delay: float = 0.0) -> None:
        super().__init__()
        self.fail = fail
        handler = self.server.RequestHandlerClass
        own = handler.do_POST  # type: ignore[attr-defined]
        receiver = self

        def do_post(request: BaseHTTPRequestHandler) -> None:
            time.sleep(delay)
            if receiver.fail > 0:
                receiver.fail -= 1
                request.rfile.read(int(request.headers["Content-Length"]))
                request.send_response(500)
                request.end_headers()
                return
            own(request)

        handler.do_POST = do_post  # type: ignore[attr-defined]


async def dead_letters_one_by_one(alert, q, n: int, first: int = 1) -> None:
    for i in range(first, first + n):
        await q.client.zadd(q.keys.dead, {str(i): i})
        await alert.check(q)
        await alert.close()


@deferred_f_from_coro_f
async def test_a_failed_post_is_sent_again_at_the_next_dead_letter(redis_url):
    """Before: the marker was set before the POST and kept after it failed: that crossing's
    alert was lost for good (8 dead letters, threshold 3, no alert)."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), Keys("ha", "alerted"))
    receiver = FlakyReceiver(fail=1)
    stats = MemoryStatsCollector(get_crawler(FaultSpider))
    alert = DeadLetterAlert(receiver.url, 3, stats, "w1")
    try:
        await dead_letters_one_by_one(alert, q, 5)
        assert [post["dead"] for post in receiver.posts] == [4]  # 3 failed, 4 delivered
        assert stats.get_value("ha/alert/errors") == 1 and stats.get_value("ha/alert/sent") == 1
        marker = await q.client.get(q.keys.dlq_alert)
        assert json.loads(marker)["state"] == "sent"
        assert await q.client.pttl(q.keys.dlq_alert) == -1  # sent: kept until below
    finally:
        receiver.close()
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_pending_alert_expires_and_only_its_worker_takes_it_back(redis_url):
    """A worker killed during the POST leaves a marker that expires (before: none did); a
    POST that failed takes back its own marker only, never another worker's."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), Keys("ha", "alerted"))
    receiver = FlakyReceiver(fail=1, delay=1.0)
    stats = MemoryStatsCollector(get_crawler(FaultSpider))
    alert = DeadLetterAlert(receiver.url, 1, stats, "w1")
    key = q.keys.dlq_alert
    try:
        await q.client.zadd(q.keys.dead, {"1": 1})
        await alert.check(q)  # the POST is under way (the receiver answers in a second)
        mine = await q.client.get(key)
        assert json.loads(mine)["state"] == "pending"
        assert 0 < await q.client.pttl(key) <= PENDING_TTL * 1000
        await q.client.set(key, "another worker's marker")  # this one expired, another set
        await alert.close()  # the POST failed: the marker is not this worker's any more
        assert await q.client.get(key) == b"another worker's marker"
        assert stats.get_value("ha/alert/errors") == 1
    finally:
        receiver.close()
        await q.client.aclose()


class TricklingReceiver:
    """Reads each POST whole, then answers one byte a second: each byte well within a
    socket timeout, the answer past the alert's time."""

    ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        receiver = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                length = 0
                while line := self.rfile.readline():
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                    if line == b"\r\n":
                        break
                receiver.posts.append(json.loads(self.rfile.read(length)))
                for byte in receiver.ANSWER:
                    try:
                        self.wfile.write(bytes([byte]))
                    except OSError:
                        return  # the client gave up
                    time.sleep(1.0)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook/secret-token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@deferred_f_from_coro_f
async def test_an_answer_trickled_past_the_alert_s_time_ends_the_post_and_is_not_sent_again(
    redis_url, caplog
):
    """Before: the 10 s timeout held each socket operation, and an answer trickled a byte a
    second kept the POST going for 38 s, its marker pending (a slower one outlived the
    marker's 60 s, and the alert went again); now the POST ends at ALERT_TIMEOUT, and one
    sent whole is taken as maybe delivered: recorded as sent, not sent again."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), Keys("ha", "alerted"))
    receiver = TricklingReceiver()
    stats = MemoryStatsCollector(get_crawler(FaultSpider))
    alert = DeadLetterAlert(receiver.url, 1, stats, "w1")
    try:
        started = time.monotonic()
        await dead_letters_one_by_one(alert, q, 1)
        assert time.monotonic() - started < ALERT_TIMEOUT + 3
        assert stats.get_value("ha/alert/unconfirmed") == 1
        assert stats.get_value("ha/alert/errors") is None
        assert json.loads(await q.client.get(q.keys.dlq_alert))["state"] == "sent"
        assert "may have been delivered, and is not sent again" in caplog.text
        assert "secret-token" not in caplog.text
        await dead_letters_one_by_one(alert, q, 2, first=2)  # past the threshold still
        assert len(receiver.posts) == 1
    finally:
        receiver.close()
        await q.client.aclose()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        # before: accepted, and the POST of the first alert failed on the host it cannot read
        ("http://[::1:8080/hook/secret-token", "'http://[::1:8080/...': its host cannot be"),
        ("http://[zz]:8080/hook/secret-token", "'http://[zz]:8080/...': its host cannot be"),
        ("http://h:80a/hook/secret-token", "'http://h:80a/...': its port is not a number"),
        # before: the whole URL shown, its secret path and password with it
        ("hooks.example/services/secret-token", "'hooks.example/...' must be an http://"),
        ("ftp://u:secret-pw@h/secret-token", "'ftp://***@h/...' must be an http://"),
        # a password with '/' or '?' unencoded: its start was shown, twice (review)
        ("https://u:secr/et@hooks.example/T0/X", "'https://***@hooks.example/...': its port"),
        ("https://u:secr?et@hooks.example/T0/X", "'https://***@hooks.example/...': its port"),
    ],
)
def test_a_webhook_that_cannot_be_used_is_named_without_its_secrets(url, message):
    from scrapy.settings import Settings
    from scrapy.statscollectors import MemoryStatsCollector

    from scrapy_ha.deadletters.alerts import DeadLetterAlert

    stats = MemoryStatsCollector(get_crawler(FaultSpider))
    with pytest.raises(ConfigError) as info:
        DeadLetterAlert.from_settings(Settings({"HA_DLQ_ALERT_WEBHOOK": url}), stats)
    assert f"HA_DLQ_ALERT_WEBHOOK={message}" in str(info.value)
    assert "secr" not in str(info.value)


@deferred_f_from_coro_f
async def test_a_sharded_crawl_alerts_on_its_whole_queue(redis_url, redis_client, site, receiver):
    """The alert counted shard 0's dead letters alone: a crawl of 3 shards would have alerted
    only once shard 0 by itself held the threshold, about three times it in all."""
    sharded = {**settings(redis_url, receiver.url, threshold=20), "HA_SHARDS": 3}
    paths = tuple(f"/status/404?n={i}" for i in range(30))
    await get_crawler(FaultSpider, sharded).crawl_async(base_url=site.url, paths=paths)
    shards = [redis_client.zcard(k.dead) for k in Keys("ha", "faults", 0, 3).every_shard()]
    assert sum(shards) == 30 and max(shards) < 20  # (no shard holds the threshold alone)
    (post,) = receiver.posts
    assert post["dead"] >= 20 and post["threshold"] == 20

    # three of shard 0's purged, the crawl's queue still past the threshold: no new crossing
    shard0 = [i.decode() for i in redis_client.zrange(Keys("ha", "faults", 0, 3).dead, 0, 2)]
    assert len(shard0) == 3
    assert cli(redis_url, "dlq", "purge", "faults", *shard0, "--yes").returncode == 0
    await get_crawler(FaultSpider, sharded).crawl_async(base_url=site.url, paths=("/status/410",))
    assert len(receiver.posts) == 1

    # below the threshold again (a purge across the shards): the next crossing alerts again
    assert cli(redis_url, "dlq", "purge", "faults", "--all", "--yes").returncode == 0
    more = tuple(f"/status/410?n={i}" for i in range(20))
    await get_crawler(FaultSpider, sharded).crawl_async(base_url=site.url, paths=more)
    assert len(receiver.posts) == 2 and receiver.posts[1]["dead"] == 20
