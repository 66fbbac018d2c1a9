"""An operator opens a domain gate early (``scrapy-ha gates open``, ops/gates.py,
gate_open.lua): every worker's next sync opens it too (sync.lua returns the change with the
time 0), and what waited behind it goes at once. Before, a gate held its domain until the
time the site asked for, up to ``HA_RETRY_AFTER_MAX`` (10 minutes by default), whatever
the operator knew: every worker kept its own copy of the gate, and the back queues and
deferred requests behind it waited for that time."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis.asyncio
from scrapy import Request
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha import metakeys
from scrapy_ha.codec import describe, encode_request
from scrapy_ha.keys import Keys
from scrapy_ha.ops.gates import closed_gates, open_gates
from scrapy_ha.scheduler.domains import ClosedDomains
from scrapy_ha.store import scripts
from scrapy_ha.store.gate_log import OPEN, GateLog
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.sharding import make_queue
from scrapy_ha.store.wire import NewEntry, SyncResult
from tests.cli_seed import SCRAPY_HA
from tests.spiders import FaultSpider
from tests.test_gate_log import page
from tests.test_retry_crawl import FAST_RETRIES, watch_gate

KEYS = Keys("ha", "gopen")


def open_queue(url: str) -> RedisQueue:
    return RedisQueue(redis.asyncio.Redis.from_url(url), KEYS)


def learn(closed: ClosedDomains, queue: RedisQueue) -> None:
    """What the worker's round does with the gates its syncs brought (session/sync.py)."""
    news, every = queue.take_gates()
    closed.learn(news, every=every)


@deferred_f_from_coro_f
async def test_an_opened_gate_reaches_the_worker_and_frees_its_parked_queue(redis_url):
    worker, operator = open_queue(redis_url), open_queue(redis_url)
    try:
        await worker.close_gate("gated.test", 600_000)
        await worker.enqueue([page("gated.test", n) for n in range(3)] + [page("free.test", 1)])
        first = await worker.sync(lease=10)
        assert [x.payload for x in first.leases] == [b'{"v":1,"u":"http://free.test/1"}']
        worker.take_gates()
        assert list(await closed_gates(operator)) == ["gated.test"]
        done = await open_gates(operator, ["gated.test", "open.test"])
        assert list(done.gates) == ["gated.test"] and done.queues == 1 and done.entries == 0
        # a new worker holds no copy: it is told of the closed gates only
        new = open_queue(redis_url)
        assert (await new.sync()).gates == {}
        await new.client.aclose()
        assert await closed_gates(operator) == {}
        second = await worker.sync(lease=10)
        assert second.gates == {"gated.test": 0}  # before: nothing, the worker's gate held
        assert worker.take_gates() == ({"gated.test": OPEN}, False)
        assert len(second.leases) == 3  # before: parked until the gate's time
        assert (await worker.sync()).gates == {}  # once
    finally:
        await worker.client.aclose()
        await operator.client.aclose()


def stored(url: str, failed: str | None = None) -> NewEntry:
    meta = {metakeys.HISTORY: [{"class": failed, "outcome": "HTTP 429"}]} if failed else {}
    host = url.split("/")[2]
    return NewEntry(url.encode(), 0, encode_request(Request(url, meta=meta), None), host=host)


@deferred_f_from_coro_f
async def test_what_waited_for_a_gate_is_made_due_when_it_opens(redis_url):
    worker = open_queue(redis_url)
    try:
        await worker.enqueue(
            [stored("http://gated.test/1"), stored("http://gated.test/2", "rate_limited")]
            + [
                stored("http://gated.test/3", "server"),
                stored("http://other.test/4", "rate_limited"),
            ]
        )
        leases = {describe(x.payload).url: x for x in (await worker.sync(lease=10)).leases}
        await worker.close_gate("gated.test", 600_000)
        # the first was held when the gate closed (deferred without an attempt), the others
        # failed: a 429 (its Retry-After), a 503, another site's 429
        whys = {"gated.test/1": "", "gated.test/2": "rate_limited", "gated.test/3": "server"}
        whys["other.test/4"] = "rate_limited"
        for path, why in whys.items():
            lease = leases[f"http://{path}"]
            assert await worker.retry_later(lease.id, lease.token, 600_000, lease.payload, 0, why)
        assert (await worker.sync(lease=10)).leases == []
        done = await open_gates(worker, ["gated.test"])
        assert (list(done.gates), done.queues, done.entries) == (["gated.test"], 0, 2)
        urls = [describe(x.payload).url for x in (await worker.sync(lease=10)).leases]
        assert sorted(urls) == ["http://gated.test/1", "http://gated.test/2"]
    finally:
        await worker.client.aclose()


@deferred_f_from_coro_f
async def test_an_open_stopped_part_way_is_finished_by_running_it_again(redis_url):
    """The gate opened, then the connection was lost before its parked queue was woken (a
    review): before, a second open found no closed gate and did nothing, and the queue
    stayed parked until the gate's old time."""
    worker = open_queue(redis_url)
    try:
        await worker.close_gate("a.test", 600_000)
        await worker.enqueue([page("a.test", 1)])
        assert (await worker.sync(lease=10)).leases == []
        opening = scripts.Registered(worker.client, "gate_open")
        await opening(keys=[KEYS.gates, KEYS.gate_log], args=["a.test"])  # and no more
        assert (await worker.sync(lease=10)).leases == []
        done = await open_gates(worker, ["a.test"])
        assert (done.gates, done.queues) == ({}, 1)
        assert len((await worker.sync(lease=10)).leases) == 1
    finally:
        await worker.client.aclose()


@deferred_f_from_coro_f
async def test_a_sharded_crawls_gate_is_opened_in_every_shard(redis_url):
    client = redis.asyncio.Redis.from_url(redis_url)
    queue = make_queue(client, "ha", "gopens", 3, worker="w1")
    try:
        await queue.close_gate("a.test", 600_000)
        await queue.sync(lease=1)
        assert set(queue.take_gates()[0]) == {"a.test"}
        done = await open_gates(queue, ["a.test"])
        assert list(done.gates) == ["a.test"]
        for shard in queue.shards:
            assert await shard.client.hlen(shard.keys.gates) == 0
        await queue.sync(lease=1)
        assert queue.take_gates() == ({"a.test": OPEN}, False)
    finally:
        await client.aclose()


def test_the_worker_opens_a_gate_redis_says_is_open():
    closed = ClosedDomains()
    now = time.monotonic()
    closed.learn({"a.test": now + 600, "b.test": now + 600}, every=False)
    closed.learn({"a.test": OPEN}, every=False)
    assert set(closed.until) == {"b.test"} and "a.test" not in closed.since
    closed.learn({"c.test": OPEN}, every=False)  # one it never held: nothing to open
    assert set(closed.until) == {"b.test"}
    # opened, then closed again for less by another worker's 429: the later word holds
    # (a review: before, the worker kept its copy of 600 s, and deferred every request of
    # the domain it leased until then)
    closed.learn({"b.test": now + 3}, every=False)
    assert closed.until["b.test"] == now + 3


def test_a_close_of_the_worker_not_sent_yet_outlives_a_reply_that_says_open():
    """A reply to a call made before this worker's own 429 says the domain is open (an
    earlier gate expired): before, it erased the worker's fresh close until the next round
    (its requests went to the site meanwhile, their 429s each an attempt)."""
    unsent: dict[str, float] = {}
    closed = ClosedDomains(unsent)
    domain = closed.close(Request("http://d.test/1"), 30)
    assert domain == "d.test"
    unsent[domain] = 30  # in the outbox, until the round sends it
    closed.learn({"d.test": OPEN}, every=False)
    assert closed.wait(Request("http://d.test/2")) > 25
    closed.learn({}, every=True)  # Redis lost its log: the close is still this worker's
    assert closed.wait(Request("http://d.test/2")) > 25
    del unsent[domain]  # sent: Redis's word is the gate's from now on
    closed.learn({"d.test": OPEN}, every=False)  # (an operator opened it)
    assert closed.wait(Request("http://d.test/2")) <= 0


@deferred_f_from_coro_f
async def test_a_worker_that_missed_an_open_takes_the_shorter_gate_a_429_closed_after(
    redis_url,
):
    worker, operator = open_queue(redis_url), open_queue(redis_url)
    try:
        await operator.close_gate("d.test", 600_000)
        await worker.sync()
        closed = ClosedDomains()
        learn(closed, worker)
        await open_gates(operator, ["d.test"])
        await operator.close_gate("d.test", 3_000)  # another worker's 429, before the sync
        await worker.sync()
        learn(closed, worker)
        assert 0 < closed.wait(Request("http://d.test/1")) <= 3  # before: 600 s
    finally:
        await worker.client.aclose()
        await operator.client.aclose()


@deferred_f_from_coro_f
async def test_an_open_stays_in_the_log_for_workers_to_read(redis_url, redis_client):
    worker = open_queue(redis_url)
    try:
        await worker.close_gate("opened.test", 600_000)
        await open_gates(worker, ["opened.test"])
        for n in range(20):  # each close sweeps the log's oldest 16
            await worker.close_gate(f"short{n}.test", 1)
        time.sleep(0.01)
        await worker.close_gate("last.test", 600_000)
        logged = {m.decode() for m in redis_client.zrange(KEYS.gate_log, 0, -1)}
        assert "!opened.test" in logged  # the open's mark, for 10 minutes
        assert not any(m.startswith("short") for m in logged)  # expired at their time
        redis_client.zadd(KEYS.gate_log, {"!opened.test": 1})  # made long ago
        await worker.close_gate("later.test", 600_000)
        assert redis_client.zscore(KEYS.gate_log, "!opened.test") is None
    finally:
        await worker.client.aclose()


@deferred_f_from_coro_f
async def test_a_worker_that_missed_an_open_and_a_short_close_after_it_opens_its_copy(
    redis_url,
):
    """The open, then a 429's close of a second that expired and was swept, all before the
    worker's next sync (a review): the worker heard nothing of the domain and kept its copy
    of 10 minutes. The open's own mark stays in the log."""
    worker, operator = open_queue(redis_url), open_queue(redis_url)
    try:
        await operator.close_gate("d.test", 600_000)
        await worker.sync()
        closed = ClosedDomains()
        learn(closed, worker)
        await open_gates(operator, ["d.test"])
        await operator.close_gate("d.test", 1)
        time.sleep(0.01)
        await operator.close_gate("e.test", 600_000)  # sweeps d.test's expired close
        await worker.sync()
        learn(closed, worker)
        assert closed.wait(Request("http://d.test/1")) <= 0
        assert closed.wait(Request("http://e.test/1")) > 0
    finally:
        await worker.client.aclose()
        await operator.client.aclose()


@deferred_f_from_coro_f
async def test_a_close_made_while_the_worker_sends_its_gates_is_sent_too(redis_url):
    """A second 429 of the domain, for longer, while the round sent the first (a review):
    the outbox's entry was deleted after the send, the longer close with it, and Redis had
    the first one only; the worker's copy then took Redis's shorter word."""
    from types import SimpleNamespace

    from scrapy_ha.scheduler.outbox import Outbox
    from scrapy_ha.scheduler.session.sync import Syncer

    queue, outbox = open_queue(redis_url), Outbox()
    closed = ClosedDomains(outbox.gates)
    sent = queue.close_gate

    async def close_gate(domain: str, ms: int) -> int:
        until = await sent(domain, ms)
        if closed.close(Request("http://d.test/2"), 120):  # the engine ran meanwhile
            outbox.close_gate("d.test", 120)
        return until

    try:
        await queue.sync()
        closed.close(Request("http://d.test/1"), 5)
        outbox.close_gate("d.test", 5)
        syncer = SimpleNamespace(queue=SimpleNamespace(close_gate=close_gate), outbox=outbox)
        await Syncer.send_gates(syncer)  # type: ignore[arg-type]
        assert outbox.gates == {"d.test": 120}  # before: {}
        await Syncer.send_gates(syncer)  # type: ignore[arg-type]
        await queue.sync()
        learn(closed, queue)
        assert closed.wait(Request("http://d.test/3")) > 100  # before: 5 s
    finally:
        await queue.client.aclose()


@deferred_f_from_coro_f
async def test_a_shard_with_a_shorter_gate_does_not_shorten_the_workers_copy(redis_url):
    """One shard kept a gate of 10 minutes the other lacked (a close that reached one shard,
    a failover); a later close of 5 s then logged a change in the other alone (a review):
    the worker took the 5 s, though shard 0 still held the domain."""
    client = redis.asyncio.Redis.from_url(redis_url)
    queue = make_queue(client, "ha", "gopend", 2, worker="w1")
    try:
        await queue.shards[0].close_gate("d.test", 600_000)
        await queue.sync(lease=1)
        closed = ClosedDomains()
        learn(closed, queue)
        await queue.close_gate("d.test", 5_000)  # every shard: only shard 1 changes
        await queue.sync(lease=1)
        learn(closed, queue)
        assert closed.wait(Request("http://d.test/1")) > 500  # before: 5 s
        await open_gates(queue, ["d.test"])
        await queue.sync(lease=1)
        learn(closed, queue)
        assert closed.wait(Request("http://d.test/1")) <= 0  # open in both
    finally:
        await client.aclose()


def reply(number: int, gates: dict[str, int]) -> SyncResult:
    counts = dict.fromkeys(("added", "acked", "stale", "pending", "leased", "delayed"), 0)
    return SyncResult(now_ms=1_000_000, gates=gates, gate_number=number, **counts)


def test_the_later_log_wins_when_replies_are_noted_out_of_order():
    log = GateLog()
    log.note(0, reply(20, {"a.test": 0}))  # opened (number 20)...
    log.note(0, reply(10, {"a.test": 1_600_000}))  # ...the older reply, noted after it
    assert log.take()[0] == {"a.test": OPEN}  # before: the latest close, whatever its number
    log.note(20, reply(30, {"a.test": 1_600_000}))  # closed again after the open
    log.note(20, reply(30, {"a.test": 0}))  # of the same log: the close holds
    assert log.take()[0]["a.test"] > time.monotonic()
    log.note(20, reply(25, {"a.test": 0}))  # older than the word taken: passed over
    assert log.take() == ({}, False)


def cli(redis_url: str, *args: str) -> tuple[int, str, str]:
    import subprocess

    done = subprocess.run(
        [SCRAPY_HA, "--redis-url", redis_url, *args], capture_output=True, text=True, timeout=60
    )
    return done.returncode, done.stdout, done.stderr


@deferred_f_from_coro_f
async def test_the_commands_list_and_open_gates(redis_url):
    queue = open_queue(redis_url)
    try:
        await queue.sync()  # the crawl exists
        await queue.close_gate("b.test", 600_000)
        await queue.close_gate("a.test", 300_000)
        await queue.close_gate("[::1]", 900_000)
        await queue.enqueue([page("a.test", n) for n in range(2)])
        await queue.sync(lease=10)  # a.test's queue parked behind its gate
    finally:
        await queue.client.aclose()
    code, out, _ = cli(redis_url, "gates", "list", "gopen")
    rows = [line.split()[0] for line in out.splitlines()[1:-1]]
    assert code == 0 and rows == ["a.test", "b.test", "[::1]"]  # soonest open first
    assert out.splitlines()[1].split()[-1] == "2"  # the requests waiting behind it
    assert out.splitlines()[-1] == "3 closed gates in gopen"
    code, out, err = cli(redis_url, "gates", "open", "gopen", "a.test", "nope.test", "--dry-run")
    assert code == 1 and "would open 1 gate of gopen" in out and "nope.test" in err
    code, _, err = cli(redis_url, "gates", "open", "gopen", "a.test")
    assert code == 1 and "without --yes" in err  # stdin is no terminal: nothing changed
    code, _, err = cli(redis_url, "gates", "open", "gopen", "a.test", "--all", "-y")
    assert code == 1 and "not both" in err
    code, out, _ = cli(redis_url, "gates", "open", "gopen", "https://A.test:8080/x", "-y")
    assert code == 0 and "opened 1 gate of gopen (a.test)" in out and "1 back queue" in out
    code, out, _ = cli(redis_url, "gates", "open", "gopen", "--all", "-y")
    assert code == 0 and "opened 2 gates of gopen ([::1], b.test)" in out
    code, out, _ = cli(redis_url, "gates", "list", "gopen")
    assert code == 0 and out.strip() == "no closed gate in gopen"
    # none listed: nothing to confirm, nor one a 429 closes meanwhile to open (a review)
    code, out, _ = cli(redis_url, "gates", "open", "gopen", "--all")
    assert code == 0 and out.strip() == "no closed gate in gopen"


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
@pytest.mark.usefixtures("fast_engine_heartbeat")
@deferred_f_from_coro_f
async def test_a_crawl_held_by_a_long_retry_after_goes_on_once_its_gate_is_opened(
    redis_url, redis_client, site
):
    """The site asks for 10 minutes (``Retry-After: 600``, ``HA_RETRY_AFTER_MAX``'s default);
    the operator opens the gate once both workers hold it, and the crawl ends within the
    minutes it waits here, not the ten. Before, each worker kept its gate closed: the
    requests it leased of the domain were deferred again until its own time."""
    paths = ("/flaky/1?fail=1&status=429&retry_after=600", *(f"/item/{i}" for i in range(2, 12)))
    worker = {**FAST_RETRIES, "REDIS_URL": redis_url, "CONCURRENT_REQUESTS": 1, "HA_PREFETCH": 1}
    crawlers = [get_crawler(FaultSpider, worker) for _ in range(2)]
    crawling = asyncio.ensure_future(
        asyncio.gather(*(c.crawl_async(base_url=site.url, paths=paths) for c in crawlers))
    )
    await watch_gate(redis_client, Keys("ha", "faults"), crawlers, crawling)
    opening = await asyncio.create_subprocess_exec(
        SCRAPY_HA,
        "--redis-url",
        redis_url,
        "gates",
        "open",
        "faults",
        "--all",
        "-y",
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await opening.communicate()
    assert opening.returncode == 0 and b"opened 1 gate of faults" in out, out
    await asyncio.wait_for(crawling, 240)  # the gate's own time is 600 s away
    assert sorted(p for c in crawlers for p in c.spider.ok) == sorted(paths)


@deferred_f_from_coro_f
async def test_a_sharded_worker_opens_its_copy_at_the_first_shard_that_says_so(redis_url):
    """A round may call one shard (the first fills its lease): the open read there was
    outweighed by the other shard's 10 minutes, and the requests of the domain just leased
    were deferred again until then (a review)."""
    client = redis.asyncio.Redis.from_url(redis_url)
    queue = make_queue(client, "ha", "gopenf", 2, worker="w1")
    try:
        await queue.close_gate("d.test", 600_000)
        await queue.sync(lease=1)
        assert set(queue.take_gates()[0]) == {"d.test"}
        await open_gates(queue, ["d.test"])
        await queue.shards[0].sync()  # a round that called shard 0 alone
        assert queue.take_gates() == ({"d.test": OPEN}, False)
    finally:
        await client.aclose()


@deferred_f_from_coro_f
async def test_a_shard_failing_over_to_an_older_copy_does_not_shorten_the_copy(
    redis_url, redis_client
):
    """Shard 0 comes back from a copy where the gate was 60 s, before a close made it 10
    minutes: its log is behind the worker's number, every shard is read again, and shard
    0's 60 s was the only word (a review): the worker's copy was cut to it."""
    client = redis.asyncio.Redis.from_url(redis_url)
    queue = make_queue(client, "ha", "gopenl", 2, worker="w1")
    try:
        await queue.close_gate("d.test", 600_000)
        await queue.sync(lease=1)
        queue.take_gates()
        keys = queue.shards[0].keys
        redis_client.delete(keys.gates, keys.gate_log)  # the older copy
        short = int(redis_client.time()[0] * 1000 + 60_000)
        redis_client.hset(keys.gates, "d.test", short)
        redis_client.zadd(keys.gate_log, {"=": 5, "d.test": 5})
        # the log found behind, then every shard read again, shard 0 first (a round that
        # called shard 0 alone)
        for shards in (queue, queue.shards[0], queue):
            await shards.sync(lease=1)
            news, _ = queue.take_gates()
            assert news.get("d.test", time.monotonic() + 600) > time.monotonic() + 500
    finally:
        await client.aclose()


@deferred_f_from_coro_f
async def test_the_dashboard_opens_a_gate_from_the_crawl_page_and_the_api(redis_url):
    from tests.test_dashboard_actions import _drive, confirm_form
    from tests.test_dashboard_api import form_token

    queue = open_queue(redis_url)
    try:
        await queue.sync()
        await queue.close_gate("a.test", 600_000)
        await queue.close_gate("b.test", 600_000)
        await queue.enqueue([page("a.test", n) for n in range(2)])
        await queue.sync(lease=10)  # a.test's queue parked behind its gate
    finally:
        await queue.client.aclose()

    def check(http: Any) -> None:
        crawl = http.get("/crawls/gopen").text
        assert 'action="/crawls/gopen/actions/open-gate"' in crawl
        form = {"csrf": form_token(crawl), "ids": "a.test"}
        confirm = http.post("/crawls/gopen/actions/open-gate", data=form)
        assert "Open the gate of 1 domain of gopen?" in confirm.text, confirm.text
        done = http.post("/crawls/gopen/actions/open-gate", data=confirm_form(confirm.text))
        assert "Opened 1 of 1 gate." in done.text, done.text
        api = "/api/crawls/gopen/actions/open-gate"
        assert http.post(api, json={"filter": {"domain": "b.test"}}).status_code == 400
        answer = http.post(api, json={"ids": ["B.test", "nope.test"]}).json()
        assert (answer["selected"], answer["touched"]) == (2, 1), answer
        assert "No domain gate closed" in http.get("/crawls/gopen").text

    await asyncio.to_thread(_drive, redis_url, check)
    worker = open_queue(redis_url)
    try:
        assert len((await worker.sync(lease=10)).leases) == 2  # a.test's, woken
    finally:
        await worker.client.aclose()
