"""A crawl whose stored requests are compacted (HA_COMPACT_PAYLOADS) read by everything that
reads them: a worker leases plain documents and frames of one queue alike, the dictionary is
written once however many workers train one at the same time, a frame that cannot be read
is set aside as corrupt with its reason (never expanded without bound), and the dead-letter
queue, ``scrapy-ha delayed``, ``dlq``, ``report`` and the dashboard show compacted requests
as they show plain ones."""

from __future__ import annotations

import asyncio
import json
import zlib
from typing import Any

import redis.asyncio
from scrapy import Request
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.codec import encode_request
from scrapy_ha.codec.compact import WBITS, Dictionary, dictionary_id, train
from scrapy_ha.codec.document import MAX_PAYLOAD_BYTES
from scrapy_ha.deadletters.dlq import DeadLetterQueue
from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.session import ends
from scrapy_ha.store import dictionary as stored_dictionaries
from scrapy_ha.store.dictionary import SAMPLES, Compactor, Dictionaries
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry
from tests import backqueues
from tests.cli_seed import scrapy_ha
from tests.spiders import CatalogueSpider

#: Item pages put in the queue before the crawl starts: odd ones plain, even ones compacted.
ITEMS = 24


class QueuedItemsSpider(CatalogueSpider):
    """Crawls what the queue holds (no start URL)."""

    name = "compacted"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self.start_urls = []


def documents(spider: Any, urls: list[str]) -> list[bytes]:
    """The documents the codec stores for item pages *urls*."""
    return [encode_request(Request(u, callback=spider.parse_item), spider) for u in urls]


def entry(n: int, payload: bytes) -> NewEntry:
    return NewEntry(b"fp-%d" % n, 0, payload, host="127.0.0.1")


def crawl_settings(redis_url: str) -> dict[str, Any]:
    """A worker that crawls what the queue holds and ends once it is idle."""
    return {
        "SCHEDULER": "scrapy_ha.Scheduler",
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.3,
        "CONCURRENT_REQUESTS": 4,
    }


def bomb(data: bytes) -> bytes:
    """A frame of dictionary 1 that would expand far past the payload size limit."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, WBITS, 8, zlib.Z_DEFAULT_STRATEGY, data)
    return b"\x01\x01" + deflate.compress(b"x" * (20 * MAX_PAYLOAD_BYTES)) + deflate.flush()


@deferred_f_from_coro_f
async def test_a_crawl_holding_both_forms_leases_both_and_sets_aside_what_cannot_be_read(
    redis_url, redis_client, site, monkeypatch
):
    monkeypatch.setattr(stored_dictionaries, "GONE_WAIT", 0.0)  # dictionary 7: not waited for
    spider = QueuedItemsSpider()
    keys = Keys("ha", spider.name)
    docs = documents(spider, [f"{site.url}/item/{n}" for n in range(1, ITEMS + 1)])
    dictionary = Dictionary(1, train(docs[:SAMPLES]))
    redis_client.hset(keys.dictionaries, "1", dictionary.data)
    stored = [dictionary.compact(d) if n % 2 == 0 else d for n, d in enumerate(docs, 1)]
    assert {dictionary_id(p) for p in stored} == {None, 1}  # both forms, one queue
    broken = [b"\x01\x07" + stored[1][2:], bomb(dictionary.data)]
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), keys)
    entries = [entry(n, p) for n, p in enumerate(stored + broken, 1)]
    assert await q.enqueue(entries) == ITEMS + 2
    await q.client.aclose()
    crawler = get_crawler(QueuedItemsSpider, crawl_settings(redis_url))
    await crawler.crawl_async(base_url=site.url)
    assert sorted(i["id"] for i in crawler.spider.items) == list(range(1, ITEMS + 1))
    assert crawler.stats.get_value("ha/dead/corrupt") == 2
    dlq = DeadLetterQueue(RedisQueue(redis.asyncio.Redis.from_url(redis_url), keys))
    dead = await dlq.entries()
    reasons = sorted(e.reason for e in dead)
    assert [e.failure_class for e in dead] == ["corrupt", "corrupt"]
    assert "dictionary 7, which is gone" in reasons[1]
    assert f"expands past {MAX_PAYLOAD_BYTES} bytes" in reasons[0]
    await dlq.queue.client.aclose()


@deferred_f_from_coro_f
async def test_requests_whose_dictionary_is_gone_wait_for_it_and_are_crawled_once_back(
    redis_url, redis_client, site, monkeypatch
):
    """A QA run: the crawl's dictionary deleted, a worker leasing requests compacted with
    it set each aside as corrupt (340 of 600 in one run, a continuous crawl's revisits)
    while the worker holding it wrote it back within 10 s; `dlq requeue` brought them
    back by hand. They wait in the delayed set for it now."""
    monkeypatch.setattr(ends, "WAIT_MS", 300)
    spider = QueuedItemsSpider()
    keys = Keys("ha", spider.name)
    docs = documents(spider, [f"{site.url}/item/{n}" for n in range(1, ITEMS + 1)])
    held = Dictionary(5, train(docs))  # held by a worker, gone from the key
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), keys)
    await q.enqueue([entry(n, held.compact(d)) for n, d in enumerate(docs, 1)])
    await q.client.aclose()
    crawler = get_crawler(QueuedItemsSpider, crawl_settings(redis_url))
    crawl = asyncio.ensure_future(crawler.crawl_async(base_url=site.url))
    while not redis_client.hget(keys.held, "#dictionary 127.0.0.1"):  # they wait
        assert not crawl.done()
        await asyncio.sleep(0.05)
    delayed = scrapy_ha("delayed", "list", spider.name, "--redis-url", redis_url).stdout
    assert "waiting for their dictionary" in delayed or "waiting for its dictionary" in delayed
    redis_client.hset(keys.dictionaries, "5", held.data)  # the holder's write-back
    await asyncio.wait_for(crawl, 120)
    assert sorted(i["id"] for i in crawler.spider.items) == list(range(1, ITEMS + 1))
    assert not crawler.stats.get_value("ha/dead/corrupt")
    assert crawler.stats.get_value("ha/dictionary_waits") >= 1


@deferred_f_from_coro_f
async def test_workers_training_at_once_store_one_dictionary_and_all_compact_with_it(
    redis_url, redis_client
):
    keys = Keys("ha", "race")
    clients = [redis.asyncio.Redis.from_url(redis_url) for _ in range(6)]
    workers = [Compactor() for _ in clients]
    try:
        for w, worker in enumerate(workers):  # each has seen requests of its own
            for n in range(SAMPLES):
                worker.sample(b'{"v":1,"u":"http://w%d.example/%d"}' % (w, n))
        await asyncio.gather(
            *(w.settle(Dictionaries(c, keys)) for w, c in zip(workers, clients, strict=True))
        )
        current = redis_client.hget(keys.dictionaries, "current")
        stored = redis_client.hget(keys.dictionaries, current)
        # one stored: a dictionary no worker compacts with is not kept
        assert sorted(redis_client.hkeys(keys.dictionaries)) == sorted([b"current", current])
        assert [w.dictionary.data for w in workers if w.dictionary] == [stored] * len(workers)
        late = Compactor()  # one that trained from requests of its own after the others
        for n in range(SAMPLES):
            late.sample(b'{"v":1,"u":"http://late.example/%d"}' % n)
        await late.settle(Dictionaries(clients[0], keys))
        assert late.dictionary is not None and late.dictionary.data == stored
        assert redis_client.hget(keys.dictionaries, current) == stored  # never changed
        assert redis_client.hlen(keys.dictionaries) == 2
    finally:
        for client in clients:
            await client.aclose()


async def _seed_readers(redis_url: str, keys: Keys, urls: list[str]) -> Dictionary:
    """The requests of *urls* compacted: the first dead-lettered (``gone``, its stored
    frame kept), the second delayed an hour (its retry stored as a frame), the rest pending."""
    spider = QueuedItemsSpider()
    docs = documents(spider, urls)
    dictionary = Dictionary(1, train(docs))
    client = redis.asyncio.Redis.from_url(redis_url)
    await client.hset(keys.dictionaries, "1", dictionary.data)
    q = RedisQueue(client, keys)
    await q.enqueue([entry(n, dictionary.compact(d)) for n, d in enumerate(docs)])
    first, second = await q.lease(2, 600_000)
    info = {"class": "gone", "reason": "HTTP 404", "status": 404, "attempts": 1}
    assert await q.dead_letter(first.id, first.token, info, payload=b"")
    assert await q.retry_later(second.id, second.token, 3_600_000, second.payload)
    await client.aclose()
    return dictionary


@deferred_f_from_coro_f
async def test_every_reader_shows_compacted_requests(redis_url, redis_client):
    from fastapi.testclient import TestClient

    from scrapy_ha.dashboard.app import create_app

    keys = Keys("ha", "readers")
    urls = [f"http://shop.example/item/{n}?ref=list" for n in range(3)]
    await _seed_readers(redis_url, keys, urls)
    stored = redis_client.hvals(keys.payload)
    assert len(stored) == 2 and all(dictionary_id(p) == 1 for p in stored)
    assert all(dictionary_id(p) == 1 for _, p in backqueues.pending(redis_client, keys))
    dlq = DeadLetterQueue(RedisQueue(redis.asyncio.Redis.from_url(redis_url), keys))
    (dead,) = await dlq.entries()
    assert dead.url == urls[0] and (await dlq.get(dead.id)).url == urls[0]
    await dlq.queue.client.aclose()
    cli = ("--redis-url", redis_url)
    delayed = scrapy_ha("delayed", "list", "readers", *cli).stdout.splitlines()
    assert delayed[1].split()[-1] == urls[1]
    listed = scrapy_ha("dlq", "list", "readers", *cli).stdout.splitlines()
    assert listed[1].split()[-1] == urls[0]
    report = json.loads(scrapy_ha("report", "readers", *cli, "--format", "json").stdout)
    assert report["top_domains"] == [["shop.example", 1]]
    app = create_app(redis.asyncio.Redis.from_url(redis_url), "ha", close_client=True)
    with TestClient(app, base_url="http://127.0.0.1") as http:
        (row,) = http.get("/api/crawls/readers/delayed").json()["entries"]
        assert row["url"] == urls[1]
        (row,) = http.get("/api/crawls/readers/dead").json()["entries"]
        assert row["url"] == urls[0]
        assert http.get(f"/api/crawls/readers/dead/{dead.id}").json()["url"] == urls[0]


@deferred_f_from_coro_f
async def test_a_request_whose_dictionary_is_gone_is_shown_as_such_not_as_bytes(
    redis_url, redis_client
):
    """A QA run: with the crawl's dictionary deleted, ``dlq list`` showed a corrupt dead
    letter's frame, bytes and all, in its URL column (``delayed list`` and the dashboard
    showed ``?``)."""
    from fastapi.testclient import TestClient

    from scrapy_ha.dashboard.app import create_app

    keys = Keys("ha", "lacks")
    urls = [f"http://shop.example/item/{n}?ref=list" for n in range(3)]
    await _seed_readers(redis_url, keys, urls)
    client = redis.asyncio.Redis.from_url(redis_url)
    q = RedisQueue(client, keys)
    (third,) = await q.lease(1, 600_000)  # dead-lettered as a worker does a corrupt one
    info = {
        "class": "corrupt",
        "reason": "gone",
        "payload": third.payload[:200].decode("utf-8", "replace"),
    }
    assert await q.dead_letter(third.id, third.token, info)
    await client.aclose()
    redis_client.delete(keys.dictionaries)
    shown = "(unreadable: compacted with dictionary 1, which the crawl lacks)"
    cli = ("--redis-url", redis_url)
    listed = scrapy_ha("dlq", "list", "lacks", *cli).stdout.splitlines()
    assert len(listed) == 4 and all(line.endswith(shown) for line in listed[1:3]), listed
    delayed = scrapy_ha("delayed", "list", "lacks", *cli).stdout.splitlines()
    assert delayed[1].endswith(shown), delayed
    app = create_app(redis.asyncio.Redis.from_url(redis_url), "ha", close_client=True)
    with TestClient(app, base_url="http://127.0.0.1") as http:
        (row,) = http.get("/api/crawls/lacks/delayed").json()["entries"]
        assert row["url"] == shown
        rows = http.get("/api/crawls/lacks/dead").json()["entries"]
        assert [r["url"] for r in rows] == [shown, shown]
