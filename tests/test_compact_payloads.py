"""Compacted payloads (codec/compact.py, store/dictionary.py): the crawl's dictionary is
trained once from its first requests, new requests are stored as frames a sixth of their
size, every reader (the worker, the dead-letter queue, the CLI) reads them back, and a frame
that cannot be read is refused, never expanded without bound."""

from __future__ import annotations

import asyncio
import json
import zlib
from typing import Any

import pytest
import redis.asyncio
from scrapy import Request
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.codec import CodecError
from scrapy_ha.codec.compact import WBITS, Dictionary, dictionary_id, expand, tag, train
from scrapy_ha.codec.document import MAX_PAYLOAD_BYTES
from scrapy_ha.deadletters.dlq import DeadLetterQueue
from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.outbox import EndOp, VisitEnd
from scrapy_ha.store import dictionary
from scrapy_ha.store.dictionary import SAMPLES, Compactor, Dictionaries
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry
from tests import backqueues
from tests.spiders import CatalogueSpider
from tests.test_keep import engine_busy
from tests.test_lease_fencing import scheduler
from tests.test_scheduler_shell import shell


def shop(n: int) -> bytes:
    """A realistic request (about 95 characters of URL), as the codec stores it."""
    url = (
        f"https://www.example-shop-{n % 997}.com/catalogue/category/books_{n % 50}/"
        f"item-{n}/index.html?ref=list"
    )
    return json.dumps({"v": 1, "u": url, "cb": "parse_item"}, separators=(",", ":")).encode()


def test_a_request_compacts_to_a_sixth_and_back():
    dictionary = Dictionary(1, train(shop(n) for n in range(SAMPLES)))
    sizes = []
    for n in range(10_000, 10_200):
        frame = dictionary.compact(shop(n))
        assert dictionary_id(frame) == 1 and expand(frame, {1: dictionary.data}) == shop(n)
        sizes.append(len(frame))
    assert sum(sizes) / len(sizes) < len(shop(10_000)) / 5  # 124 bytes to about 21
    # a document is read as it is; a frame no smaller than the request is not made
    assert expand(shop(1), {}) == shop(1)
    assert dictionary.compact(b"{}") == b"{}"


def test_a_frame_that_cannot_be_read_is_refused_and_never_expands_past_the_limit():
    data = train([shop(1)])
    with pytest.raises(CodecError, match="dictionary 7, which is gone"):
        expand(b"\x01\x07abc", {1: data})
    with pytest.raises(CodecError, match="cannot be read"):
        expand(b"\x01\x01not deflate data", {1: data})
    deflate = zlib.compressobj(9, zlib.DEFLATED, WBITS, 8, zlib.Z_DEFAULT_STRATEGY, data)
    bomb = b"\x01\x01" + deflate.compress(b"x" * (MAX_PAYLOAD_BYTES + 10)) + deflate.flush()
    assert len(bomb) < 20_000
    with pytest.raises(CodecError, match="expands past"):
        expand(bomb, {1: data})


def test_a_frame_read_with_another_dictionary_under_its_id_is_refused_not_another_request():
    """Raw deflate holds no check: a frame expanded with another dictionary gives another
    request, often well-formed (a QA run: a crawl's dictionary deleted by hand, a worker
    trained another under the same id, and the workers crawled one another's requests as
    other URLs, silently). Its tag makes that an error; a frame of an earlier version (no
    tag) is read as it was."""
    first = Dictionary(1, train([shop(n) for n in range(0, 600, 5)]))
    second = Dictionary(1, train([shop(n) for n in range(1, 600, 5)]))
    assert first.tag != second.tag
    for n in range(600):
        frame = first.compact(shop(n))
        assert frame[:4] == b"\x02\x01" + first.tag
        assert expand(frame, {1: first.data}) == shop(n)
        with pytest.raises(CodecError, match="another dictionary than the crawl's dictionary 1"):
            expand(frame, {1: second.data})
    deflate = zlib.compressobj(6, zlib.DEFLATED, WBITS, 4, zlib.Z_DEFAULT_STRATEGY, first.data)
    untagged = b"\x01\x01" + deflate.compress(shop(5)) + deflate.flush()
    assert dictionary_id(untagged) == 1 and expand(untagged, {1: first.data}) == shop(5)


def test_a_round_compacts_the_new_requests_but_those_handed_out():
    """A request handed out from memory is stored leased to its worker and acked once it is
    done: it goes as a document. One that waits in Redis goes as a frame, once, however
    often its round is sent; so does one kept in the worker's buffer, which goes back
    pending when newer requests crowd it out. All train the dictionary."""
    s, _, _ = shell()
    s._slots.free = lambda crawler, request: True  # the engine has room: handed out
    compactor = s.admission.compactor
    for n in range(SAMPLES):
        s.enqueue_request(Request(f"https://shop.test/catalogue/item-{n}/index.html"))
        if n < 8:  # (within HA_MAX_INFLIGHT)
            assert s.next_request() is not None
    assert len(compactor.samples) == SAMPLES  # handed out or not
    compactor.adopt(Dictionary(1, train(compactor.samples)))
    del s.outbox.children[:]
    s.enqueue_request(Request("https://shop.test/catalogue/item-900/index.html"))
    assert s.next_request() is not None
    engine_busy(s)  # the next ones wait for the round
    for n in (901, 902):
        s.enqueue_request(Request(f"https://shop.test/catalogue/item-{n}/index.html"))
    handed, kept, pending = s.outbox.children
    s.handout.seal([pending], keep=False)  # a batch before the last: nothing is kept
    s.handout.seal([handed, kept])  # the last: a LIFO worker alone keeps what fits
    assert handed.taken is not None and kept.kept and pending.taken is None
    assert dictionary_id(handed.payload) is None and b"item-900" in handed.payload
    assert dictionary_id(kept.payload) == dictionary_id(pending.payload) == 1
    frame, data = pending.payload, compactor.dictionary.data
    assert b"item-901" in expand(kept.payload, {1: data})
    assert b"item-902" in expand(frame, {1: data})
    s.handout.seal([pending], keep=False)  # the round failed: sent again
    assert pending.payload == frame and expand(frame, {1: data})[:1] == b"{"


@deferred_f_from_coro_f
async def test_a_retry_and_a_revisit_wait_compacted_a_dead_letter_stays_a_document(redis_url):
    """A retry waits in the delayed set for its delay, a revisit for its interval (every
    page of a continuous crawl): both are stored as frames once the crawl has a dictionary.
    A dead letter stays the document (the archive and the operator read it)."""
    client = redis.asyncio.Redis.from_url(redis_url)
    q = RedisQueue(client, Keys("ha", "ends"))
    s = scheduler(q)
    s.session.spider = s.session.ends.spider = s.spider = CatalogueSpider()
    samples = [shop(n) for n in range(SAMPLES)]
    s.admission.compactor.adopt(Dictionary(1, train(samples)))
    await q.sync(enqueue=[NewEntry(b"", 0, shop(n)) for n in range(3)])
    retried, revisited, dead = (await q.sync(lease=3, lease_ms=30_000)).leases
    url = "https://www.example-shop-1.com/catalogue/category/books_1/item-1/index.html"
    visit = VisitEnd(3600.0, b"f" * 12, "changed")
    await s.session.ends.end_ops(
        [
            EndOp("retry", retried.id, retried.token, Request(url + "?r"), 60.0),
            EndOp("revisit", revisited.id, revisited.token, Request(url + "?v"), visit=visit),
            EndOp("dead", dead.id, dead.token, Request(url + "?d")),
        ],
        3,
    )
    stored = await client.hmget(q.keys.payload, [retried.id, revisited.id, dead.id])
    assert [dictionary_id(payload) for payload in stored] == [1, 1, None]
    data = s.admission.compactor.dictionary.data
    assert [json.loads(expand(p, {1: data}))["u"][-2:] for p in stored] == ["?r", "?v", "?d"]
    assert await client.zcard(q.keys.delayed) == 2 and await client.zcard(q.keys.dead) == 1
    await client.aclose()


@deferred_f_from_coro_f
async def test_a_worker_writes_back_the_dictionary_a_server_lacks_and_says_when_it_differs(
    redis_url, caplog
):
    """What a worker does when a failover lost children (tests/test_failover_lost_children.py
    runs it on real servers): the dictionaries it knows go back into the key; one the key
    holds otherwise is said in an ERROR. A field written by hand ("01") is no dictionary."""
    client = redis.asyncio.Redis.from_url(redis_url)
    keys = Keys("ha", "restore")
    data = train([shop(n) for n in range(SAMPLES)])
    await client.hset(keys.dictionaries, mapping={"1": data, "01": b"junk", "+2": b"junk"})
    dictionaries = Dictionaries(client, keys, worker=True)
    assert (await dictionaries.load()).data == data and set(dictionaries.known) == {1}
    await client.hdel(keys.dictionaries, "1")  # the promoted replica lacks it
    assert await dictionaries.restore() == 1
    assert await client.hget(keys.dictionaries, "1") == data
    assert await dictionaries.restore() == 0  # there: nothing to say
    assert "another compaction dictionary" not in caplog.text
    await client.hset(keys.dictionaries, "1", b"another")  # trained after the failover
    assert await dictionaries.restore() == 0
    assert "holds another compaction dictionary under id 1" in caplog.text
    assert sorted(await client.hkeys(keys.dictionaries)) == [b"+2", b"01", b"1", b"current"]
    assert await client.hget(keys.dictionaries, "current") == b"1"  # (written back too)
    await client.aclose()


@deferred_f_from_coro_f
async def test_a_deleted_dictionary_is_written_back_and_another_trained_takes_another_id(
    redis_url, monkeypatch
):
    """A QA run deleted the crawl's dictionary mid-crawl: a worker started then trained
    another under the same id and published it, the workers crawled one another's requests
    as other URLs, and the one holding the first never wrote it back. A review of the fix
    found a worker that met no request compacted with the lost one (they wait in the
    delayed set: a continuous crawl's revisits) still trained another under its id, and
    those requests were then refused for good, written back or not."""
    monkeypatch.setattr(dictionary, "RESTORE_EVERY", 0.0)  # every round looks
    client = redis.asyncio.Redis.from_url(redis_url)
    keys = Keys("ha", "gone")
    holder, late = Compactor(), Compactor()
    for n in range(SAMPLES):
        holder.sample(shop(n))
        late.sample(shop(10_000 + n))
    held = Dictionaries(client, keys, worker=True)
    await holder.settle(held)  # trains the crawl's dictionary and publishes it
    assert holder.dictionary is not None
    frame = holder.pending(shop(1))  # a request of the crawl, compacted with it
    await client.delete(keys.dictionaries)  # deleted by hand
    fresh = Dictionaries(client, keys, worker=True)
    assert await fresh.load() is None  # a worker that meets none of its requests
    await late.settle(fresh)
    assert late.dictionary is not None and late.dictionary.id != holder.dictionary.id
    assert late.dictionary.data != holder.dictionary.data
    late_frame = late.pending(shop(2))
    await holder.settle(held)  # the holder's look: it writes its own back
    assert await client.hget(keys.dictionaries, str(holder.dictionary.id)) == (
        holder.dictionary.data
    )
    assert await client.hget(keys.dictionaries, "current") == str(late.dictionary.id).encode()
    reader = Dictionaries(client, keys)  # a reader after both: each request reads as itself
    await reader.ensure([frame, late_frame])
    assert (reader.expand(frame), reader.expand(late_frame)) == (shop(1), shop(2))
    met = Dictionaries(client, keys, worker=True)  # one that met the holder's requests
    await client.delete(keys.dictionaries)
    await met.ensure([frame])
    assert met.gone == {holder.dictionary.id}
    again = Compactor()
    for n in range(SAMPLES):  # the samples the holder trained from: the same dictionary
        again.sample(shop(n))
    await again.settle(met)  # its id is known lost: another is taken
    assert again.dictionary is not None and again.dictionary.id != holder.dictionary.id
    assert again.dictionary.data == holder.dictionary.data
    await client.aclose()


@deferred_f_from_coro_f
async def test_the_crawl_trains_one_dictionary_and_every_worker_compacts_with_it(redis_url):
    client = redis.asyncio.Redis.from_url(redis_url)
    keys = Keys("ha", "dict")
    first, second = Compactor(), Compactor()
    for n in range(SAMPLES):
        first.sample(shop(n))
        assert first.pending(shop(n)) == shop(n)  # plain while the crawl has no dictionary
        second.sample(shop(10_000 + n))
    assert first.wants_dictionary and second.wants_dictionary
    await first.settle(Dictionaries(client, keys))
    await second.settle(Dictionaries(client, keys))  # the first one's is kept: one per crawl
    assert first.dictionary is not None and second.dictionary is not None
    current = await client.hget(keys.dictionaries, "current")
    assert current == str(first.dictionary.id).encode() and first.dictionary.id >= 2
    assert first.dictionary.data == second.dictionary.data
    assert first.dictionary.data == await client.hget(keys.dictionaries, current)
    third = Compactor()
    third.adopt(await Dictionaries(client, keys).load())  # a worker that joins later
    assert third.pending(shop(5)) == first.pending(shop(5)) != shop(5)
    off = Compactor(enabled=False)  # HA_COMPACT_PAYLOADS = False
    off.adopt(await Dictionaries(client, keys).load())
    off.sample(shop(5))
    assert off.pending(shop(5)) == shop(5) and not off.samples
    await client.aclose()


def trained_crawl(redis_url: str, **more: Any) -> dict[str, Any]:
    """Settings of a crawl of the scheduler alone, two requests at a time, whose site's 260
    requests train a dictionary (its first 128)."""
    return {
        "SCHEDULER": "scrapy_ha.Scheduler",
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.3,
        "CONCURRENT_REQUESTS": 2,
        "LOG_LEVEL": "INFO",
        **more,
    }


@deferred_f_from_coro_f
async def test_a_crawl_stores_compacted_requests_and_reads_them_back(
    redis_url, redis_client, site_factory
):
    site = site_factory("--pages", "20", "--per-page", "12")  # 260 requests: 128 train
    settings = trained_crawl(redis_url, SCHEDULER_PERSIST=True)
    keys = Keys("ha", "catalogue")
    crawler = get_crawler(CatalogueSpider, settings)
    await crawler.crawl_async(base_url=site.url)
    # the requests after the first 128 were stored compacted, and read back by the worker
    assert sorted(i["id"] for i in crawler.spider.items) == list(range(1, 241))
    current = redis_client.hget(keys.dictionaries, "current")
    assert b'"u":"' in (redis_client.hget(keys.dictionaries, current) or b"")
    assert not crawler.stats.get_value("ha/dead/corrupt")


@deferred_f_from_coro_f
async def test_a_dictionaries_key_of_another_type_leaves_requests_uncompacted(
    redis_url, redis_client, site_factory
):
    """A QA run: ``SET ha:{qa}:dict junk`` before the crawl trained its dictionary; the
    worker said "Redis refused a scrapy-ha command (WRONGTYPE ...); retrying in 1 s", naming
    no key, every second for ever, and the crawl never ended. It stores its requests
    uncompacted, and leaves the key alone (a review: renamed, another dictionary trained
    under the same id read what the first compacted as other requests)."""
    site = site_factory("--pages", "20", "--per-page", "12")  # 260 requests: 128 train
    keys = Keys("ha", "catalogue")
    redis_client.set(keys.dictionaries, "junk")
    settings = {
        "SCHEDULER": "scrapy_ha.Scheduler",
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.3,
        "CONCURRENT_REQUESTS": 2,
    }
    crawler = get_crawler(CatalogueSpider, settings)
    await asyncio.wait_for(crawler.crawl_async(base_url=site.url), 120)
    assert sorted(i["id"] for i in crawler.spider.items) == list(range(1, 241))
    assert redis_client.get(keys.dictionaries) == b"junk"  # as it was
    assert crawler.stats.get_value("finish_reason") == "finished"


@deferred_f_from_coro_f
async def test_compacted_requests_in_the_queue_and_the_dead_letter_queue_are_read(
    redis_url, redis_client
):
    keys = Keys("ha", "cp")
    dictionary = Dictionary(1, train(shop(n) for n in range(SAMPLES)))
    redis_client.hset(keys.dictionaries, "1", dictionary.data)
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), keys)
    frames = [dictionary.compact(shop(n)) for n in range(100, 103)]
    await q.sync(enqueue=[shop_entry(n, f) for n, f in zip(range(100, 103), frames, strict=True)])
    stored = [p for _, p in backqueues.pending(redis_client, keys)]
    assert stored == frames  # pending as frames, 21 bytes or so each
    # a frame that reaches the dead-letter queue as it was stored is read by its tools
    (lease, *_) = await q.lease(3, 30000)
    assert await q.dead_letter(lease.id, lease.token, {"class": "gone"}, payload=b"")
    assert redis_client.hget(keys.payload, lease.id) == frames[0]
    dlq = DeadLetterQueue(q)
    entry = await dlq.get(lease.id)
    assert entry is not None and entry.url == json.loads(shop(100))["u"]
    assert await dlq.requeue([lease.id]) == 1  # its attempts reset: read, changed, requeued
    requeued = [p for i, p in backqueues.pending(redis_client, keys) if i == lease.id.encode()]
    assert requeued == [shop(100)]
    await q.client.aclose()


def shop_entry(n: int, payload: bytes) -> NewEntry:
    return NewEntry(b"fp%d" % n, 0, payload, host=f"www.example-shop-{n % 997}.com")


@deferred_f_from_coro_f
async def test_a_worker_without_a_dictionary_adopts_the_one_published_since_it_started(
    redis_url, monkeypatch, caplog
):
    """A worker finds the current dictionary every ``RESTORE_EVERY`` seconds, before it has
    seen enough requests to train one; a ``current`` that names a dictionary the key lacks
    (written by hand) leaves the publishing worker uncompacted, said in an ERROR."""
    monkeypatch.setattr(dictionary, "RESTORE_EVERY", 0.0)
    client = redis.asyncio.Redis.from_url(redis_url)
    keys = Keys("ha", "since")
    first, joined = Compactor(), Compactor()
    joined_keys = Dictionaries(client, keys, worker=True)
    assert await joined_keys.load() is None  # started before any was published
    for n in range(SAMPLES):
        first.sample(shop(n))
    await first.settle(Dictionaries(client, keys, worker=True))
    assert first.dictionary is not None and not joined.wants_dictionary
    await joined.settle(joined_keys)
    assert joined.dictionary is not None and joined.dictionary.data == first.dictionary.data
    await client.hset(keys.dictionaries, "current", "77")  # by hand: no dictionary 77
    late = Compactor()
    for n in range(SAMPLES):
        late.sample(shop(n))
    await late.settle(Dictionaries(client, keys, worker=True))
    assert late.dictionary is None and not late.enabled
    assert "names '77' current, which it does not hold" in caplog.text
    assert await client.hget(keys.dictionaries, "current") == b"77"  # left as it was
    await client.aclose()


async def _holder(client: Any, keys: Keys) -> tuple[Compactor, Dictionaries]:
    """A worker that trained the crawl's dictionary and published it, and its view of the
    key."""
    holder, held = Compactor(), Dictionaries(client, keys, worker=True)
    for n in range(SAMPLES):
        holder.sample(shop(n))
    await holder.settle(held)
    return holder, held


@deferred_f_from_coro_f
async def test_a_worker_stops_compacting_when_garbage_replaces_the_dictionaries_key(
    redis_url, monkeypatch, caplog
):
    """A review: with ``SET ha:{S}:dict junk`` mid-crawl, a worker holding the dictionary
    said in an ERROR that it stores its requests uncompacted, and went on compacting them
    with a dictionary no other reader could read."""
    monkeypatch.setattr(dictionary, "RESTORE_EVERY", 0.0)
    client = redis.asyncio.Redis.from_url(redis_url)
    keys = Keys("ha", "junked")
    holder, held = await _holder(client, keys)
    assert holder.pending(shop(1)) != shop(1)
    await client.delete(keys.dictionaries)
    await client.set(keys.dictionaries, "junk")
    await holder.settle(held)
    assert "stores its requests uncompacted" in caplog.text
    assert holder.pending(shop(1)) == shop(1) and holder.dictionary is None
    await client.aclose()


@deferred_f_from_coro_f
async def test_a_holder_whose_id_another_dictionary_took_goes_by_the_key_s(
    redis_url, monkeypatch, caplog
):
    """A review: after the key was lost, another dictionary published under the id of the
    one a worker held (one in 254); the holder said so in an ERROR, and went on compacting
    with its own, so that no other reader could read its new requests, nor it theirs."""
    monkeypatch.setattr(dictionary, "RESTORE_EVERY", 0.0)
    client = redis.asyncio.Redis.from_url(redis_url)
    keys = Keys("ha", "taken")
    holder, held = await _holder(client, keys)
    own = holder.dictionary
    assert own is not None
    other = train(shop(10_000 + n) for n in range(SAMPLES))
    await client.delete(keys.dictionaries)  # lost; another trained lands on the same id
    await client.hset(keys.dictionaries, mapping={str(own.id): other, "current": str(own.id)})
    await holder.settle(held)
    assert f"holds another compaction dictionary under id {own.id}" in caplog.text
    assert holder.dictionary is not None and holder.dictionary.data == other
    frame = holder.pending(shop(3))
    reader = Dictionaries(client, keys)
    await reader.ensure([frame])
    assert reader.expand(frame) == shop(3)  # its new requests are read by every reader
    assert held.expand(Dictionary(own.id, other).compact(shop(4))) == shop(4)
    await client.aclose()


@deferred_f_from_coro_f
async def test_a_key_without_current_but_a_dictionary_of_this_version_is_no_earlier_one(
    redis_url, monkeypatch
):
    """A review: a worker that writes back the dictionaries it met before it had one of its
    own leaves a key with a dictionary and no ``current``; a worker that loaded it took it
    for an earlier version's key (compacting with id 1, which it lacks) and never looked
    for the crawl's current dictionary again."""
    monkeypatch.setattr(dictionary, "RESTORE_EVERY", 0.0)
    client = redis.asyncio.Redis.from_url(redis_url)
    keys = Keys("ha", "nocurrent")
    data = train(shop(n) for n in range(SAMPLES))
    await client.hset(keys.dictionaries, "239", data)  # written back, no current
    joined, joined_keys = Compactor(), Dictionaries(client, keys, worker=True)
    assert await joined_keys.load() is None and joined_keys.current_id is None
    await joined.settle(joined_keys)
    assert joined.dictionary is None
    await client.hset(keys.dictionaries, "current", "239")  # the holder's look names it
    await joined.settle(joined_keys)
    assert joined.dictionary is not None and joined.dictionary.id == 239
    garbage = Dictionaries(client, keys, worker=True)  # ``current`` written by hand
    await client.hset(keys.dictionaries, mapping={"current": "abc", "1": data})
    assert await garbage.load() is None and garbage.current_id is None
    await client.aclose()


@deferred_f_from_coro_f
async def test_an_earlier_version_s_dictionary_compacts_into_frames_its_workers_read(redis_url):
    """A rolling upgrade (a QA run): workers of a version of 2026-12-02 to 2026-12-05
    stored the crawl's dictionary under id 1 with no ``current`` and read only frames of
    ``\\x01``, the id, then raw deflate. This version's workers compacted with that
    dictionary into tagged frames, which the earlier workers took for documents and set
    aside as corrupt (47 requests of a 3-worker crawl upgraded one worker at a time, two
    list pages among them: half the site never crawled). Their frames now are as the earlier
    version's; a dictionary this version trains keeps its tag."""
    client = redis.asyncio.Redis.from_url(redis_url)
    keys = Keys("ha", "earlier")
    data = train(shop(n) for n in range(SAMPLES))
    await client.hset(keys.dictionaries, "1", data)  # the earlier version's HSETNX of "1"
    worker = Compactor()
    await worker.settle(await _loaded(client, keys))
    reader = Dictionaries(client, keys)
    for n in range(SAMPLES, 2 * SAMPLES):
        frame = worker.pending(shop(n))
        assert frame[:2] == b"\x01\x01" and len(frame) < len(shop(n))
        earlier = zlib.decompressobj(WBITS, data)  # how the earlier version reads a frame
        assert earlier.decompress(frame[2:]) + earlier.flush() == shop(n)
        await reader.ensure([frame])
        assert reader.expand(frame) == shop(n)
    await client.delete(keys.dictionaries)
    trained = Compactor()
    for n in range(SAMPLES):
        trained.sample(shop(n))
    await trained.settle(await _loaded(client, keys))
    assert trained.dictionary is not None and trained.dictionary.id >= 2
    assert trained.pending(shop(5))[:4] == bytes((2, trained.dictionary.id)) + tag(data)
    await client.aclose()


@deferred_f_from_coro_f
async def test_a_worker_that_trains_after_an_earlier_version_published_adopts_its_dictionary(
    redis_url,
):
    """A crawl started by workers of two versions (nodes upgraded, others not yet): an
    earlier version's worker published the dictionary (id 1, no ``current``) after this
    version's worker had read the key; once it had seen enough requests this one published
    its own as ``current``, into tagged frames the earlier workers set aside as corrupt."""
    client = redis.asyncio.Redis.from_url(redis_url)
    keys = Keys("ha", "both")
    worker, dictionaries = Compactor(), await _loaded(client, keys)  # nothing there yet
    earlier = train(shop(10_000 + n) for n in range(SAMPLES))
    await client.hset(keys.dictionaries, "1", earlier)  # the earlier version's HSETNX of "1"
    for n in range(SAMPLES):
        worker.sample(shop(n))
    await worker.settle(dictionaries)
    assert worker.dictionary is not None and worker.dictionary.data == earlier
    assert worker.pending(shop(5))[:2] == b"\x01\x01"
    assert await client.hkeys(keys.dictionaries) == [b"1"]
    await client.aclose()


async def _loaded(client: Any, keys: Keys) -> Dictionaries:
    dictionaries = Dictionaries(client, keys, worker=True)
    await dictionaries.load()
    return dictionaries


@deferred_f_from_coro_f
async def test_the_wait_for_a_lost_dictionary_is_the_crawl_s_not_a_worker_s(redis_url, monkeypatch):
    """A review: the 60 s a request waits for its lost dictionary were counted from when
    each worker process found it missing, so workers restarted within 60 s kept the
    requests waiting for ever; and a worker that had found it missing once set them aside
    at once when it was lost again later, the first time forgotten by nobody."""
    monkeypatch.setattr(dictionary, "GONE_WAIT", 0.5)
    client = redis.asyncio.Redis.from_url(redis_url)
    keys = Keys("ha", "waits")
    holder, held = await _holder(client, keys)
    frame = holder.pending(shop(1))
    await client.delete(keys.dictionaries)  # lost
    first = Dictionaries(client, keys, worker=True)
    await first.ensure([frame])
    assert first.waits_for(frame) and await client.hexists(
        keys.dictionaries, f"gone:{holder.dictionary.id}"
    )
    await asyncio.sleep(0.6)
    restarted = Dictionaries(client, keys, worker=True)  # another process, later
    await restarted.ensure([frame])
    assert not restarted.waits_for(frame)  # the crawl's wait is over: set aside
    await held.restore()  # a holder writes it back: the wait ends with it
    assert not await client.hexists(keys.dictionaries, f"gone:{holder.dictionary.id}")
    await client.delete(keys.dictionaries)  # lost again, later
    await first.ensure([frame])
    assert first.waits_for(frame)  # a new wait, not the first one's end
    await client.aclose()


@deferred_f_from_coro_f
async def test_the_wait_for_a_lost_dictionary_goes_by_redis_s_clock_and_its_marks(
    redis_url, monkeypatch
):
    """A review of the crawl-wide wait: each worker's own clock was stored and compared (a
    finder 90 s behind had every other worker set the requests aside at once); a garbage or
    future mark made them wait for ever (5,000 digits: a traceback each round); a worker
    that never met the lost dictionary trained another under its id though the key named
    it lost; and a mark stayed beside a dictionary put back by hand."""
    monkeypatch.setattr(dictionary, "GONE_WAIT", 0.5)
    client = redis.asyncio.Redis.from_url(redis_url)
    keys = Keys("ha", "clock")
    holder, _ = await _holder(client, keys)
    own, frame = holder.dictionary.id, holder.pending(shop(1))
    await client.delete(keys.dictionaries)
    seconds, micros = await client.time()
    server_ms = seconds * 1000 + micros // 1000
    marks = [(server_ms - 61_000, False), (server_ms - 100, True), ("x", True), ("9" * 5000, True)]
    for mark, waits in marks:
        await client.hset(keys.dictionaries, f"gone:{own}", mark)
        worker = Dictionaries(client, keys, worker=True)
        await worker.ensure([frame])
        assert worker.waits_for(frame) is waits, mark
    await client.hset(keys.dictionaries, f"gone:{own}", server_ms + 3_600_000)  # to come
    worker = Dictionaries(client, keys, worker=True)
    await worker.ensure([frame])
    assert worker.waits_for(frame)
    await asyncio.sleep(0.6)
    assert not worker.waits_for(frame)  # the mark was written over with now: it ends
    again = Compactor()
    for n in range(SAMPLES):  # the holder's samples: the lost one's id, were it free
        again.sample(shop(n))
    await again.settle(Dictionaries(client, keys, worker=True))
    assert again.dictionary is not None and again.dictionary.id != own
    await client.hset(keys.dictionaries, str(own), holder.dictionary.data)  # by hand
    await Dictionaries(client, keys, worker=True).load()
    assert not await client.hexists(keys.dictionaries, f"gone:{own}")
    await client.aclose()


def large(n: int) -> bytes:
    """A request over the training's SAMPLE_MAX_BYTES (a POST of a 600-byte form)."""
    doc = {"v": 1, "u": f"https://api.example/search?n={n}", "m": "POST", "b": "q=x&" * 150}
    return json.dumps(doc, separators=(",", ":")).encode()


@deferred_f_from_coro_f
async def test_a_crawl_that_starts_with_large_requests_trains_from_the_small_ones(redis_url):
    """A review: a worker kept its first 128 requests as samples whatever their size; the
    training skips those over SAMPLE_MAX_BYTES, so a crawl whose first requests were large
    (POST bodies, big meta) published an empty dictionary, the crawl's for good: its small
    requests then compacted to 109 bytes, not 17. Now the samples are those the training
    takes; a crawl of large requests alone trains from what fits once TRAIN_AFTER were
    offered (an empty dictionary still deflates them, as before)."""
    client = redis.asyncio.Redis.from_url(redis_url)
    first = Compactor()
    for n in range(SAMPLES):
        first.sample(large(n))
    assert not first.wants_dictionary and first.samples == []
    for n in range(SAMPLES):
        first.sample(shop(n))
    assert first.wants_dictionary
    await first.settle(Dictionaries(client, Keys("ha", "mixed")))
    assert first.dictionary is not None and len(first.dictionary.data) > 1_000
    assert len(first.pending(shop(10_001))) < 40
    only_large = Compactor()
    for n in range(dictionary.TRAIN_AFTER):
        only_large.sample(large(n))
    assert only_large.wants_dictionary  # trains what fits (nothing): deflate alone
    await only_large.settle(Dictionaries(client, Keys("ha", "large")))
    assert only_large.dictionary is not None
    assert len(only_large.pending(large(1))) < len(large(1)) / 4
    await client.aclose()
