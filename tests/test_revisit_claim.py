"""One revisit entry per URL (lua/lib/revisit.lua: revisit_claim) keeps the established
entry: a copy of its URL (a crawl without a dupefilter queues one per link) that finishes
while the established entry is due, promoted to its back queue and not leased yet, ends as
the double, not the established entry with its history (visit count, validators,
evidence). And an entry dead-lettered as poison by reclaim.lua leaves ``ha:{S}:revisits``
at once, as one dead-lettered by a worker does (dead.lua). Against a real Redis."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.revisits import DOUBLE, Revisit, revisit
from scrapy_ha.store.wire import NewEntry
from tests.test_revisit_figures import lease_when_due

KEYS = Keys("ha", "claim")
URL = "http://a.test/page"
#: what the established entry's payload keeps of its URL's history (RevisitState's meta)
HISTORY = {"n": 40, "f": 2, "etag": '"v40"'}


def payload(history: dict[str, Any] | None = None) -> bytes:
    request: dict[str, Any] = {"v": 1, "u": URL}
    if history is not None:
        request["m"] = {"revisit": history}
    return json.dumps(request).encode()


def end(lease: Any, body: bytes, ms: int) -> Revisit:
    """The visit of *lease* ends as a revisit in *ms*, the URL's fingerprint sent (as it is
    without a dupefilter: kept seen by no one, ``seen=False``)."""
    return Revisit(lease.id, lease.token, ms, body, b"fp-page", "unchanged", 0, "60", seen=False)


async def until_due(q: RedisQueue, entry_id: str) -> None:
    """Waits until Redis's clock reaches the due time of *entry_id* in the delayed set."""
    due = await q.client.zscore(KEYS.delayed, entry_id)
    for _ in range(500):
        seconds, micros = await q.client.time()
        if seconds * 1000 + micros // 1000 >= due:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the entry never came due")


@deferred_f_from_coro_f
async def test_a_copy_finishing_while_the_revisit_is_pending_ends_as_the_double(redis_url):
    """Before, the copy claimed the URL (the pending entry was neither leased nor delayed,
    so it "gave way"), and the established entry ended as the double: ``due == -1``, and
    what was left was the copy's fresh history (``n: 1``)."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    await q.enqueue([NewEntry(b"page", 0, payload())])
    first = await lease_when_due(q)
    assert (await revisit(q, end(first, payload(HISTORY), 20))).due > 0  # established
    await until_due(q, first.id)
    # A second link to the URL is queued (nothing filters it), and the same call promotes
    # the due entry to its back queue and leases the copy first (a revisit goes after the
    # other requests of its priority).
    copy = NewEntry(b"copy", 0, payload())
    (copy_lease,) = (await q.sync(enqueue=[copy], lease=1, lease_ms=30_000, promote=10)).leases
    assert copy_lease.id != first.id
    assert await q.client.zscore(KEYS.delayed, first.id) is None  # pending, not leased
    assert await q.client.zscore(KEYS.leased, first.id) is None
    fresh = {"n": 1, "f": 0}
    assert (await revisit(q, end(copy_lease, payload(fresh), 20))).due == DOUBLE
    again = await lease_when_due(q)
    assert again.id == first.id
    kept = {**HISTORY, "n": 41}
    assert (await revisit(q, end(again, payload(kept), 20))).due > 0  # not the double
    assert await q.client.hget(KEYS.revisit_urls, b"fp-page") == first.id.encode()
    assert await q.client.zrange(KEYS.revisits, 0, -1) == [first.id.encode()]
    assert await q.client.hget(KEYS.payload, first.id) == payload(kept)
    stats = await q.client.hgetall(KEYS.stats)
    assert stats[b"revisit_double"] == b"1"
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_dead_lettered_claimant_gives_way_to_a_copy(redis_url):
    """The rule's other side: an established entry dead-lettered (a page gone) holds its
    URL no more, even while it is still in the revisits set (as one dead-lettered as poison
    before reclaim.lua took it out): a copy that finishes revisits the URL."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    await q.enqueue([NewEntry(b"page", 0, payload())])
    first = await lease_when_due(q)
    assert (await revisit(q, end(first, payload(HISTORY), 20))).due > 0
    gone = await lease_when_due(q)
    assert gone.id == first.id
    info = {"class": "gone", "reason": "HTTP 404"}
    assert await q.dead_letter(gone.id, gone.token, info, payload=gone.payload) == 1
    await q.client.zadd(KEYS.revisits, {first.id: 0})  # as an older reclaim.lua left it
    await q.enqueue([NewEntry(b"copy", 0, payload())])
    copy = await lease_when_due(q)
    assert (await revisit(q, end(copy, payload(), 20))).due > 0
    assert await q.client.hget(KEYS.revisit_urls, b"fp-page") == copy.id.encode()
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_revisit_dead_lettered_as_poison_leaves_the_revisits_set(redis_url):
    """Before, reclaim.lua dead-lettered it and left its due time in ``ha:{S}:revisits``
    (counted as a revisited URL by status and the dashboard) up to a day."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    await q.enqueue([NewEntry(b"page", 0, payload())])
    first = await lease_when_due(q)
    assert (await revisit(q, end(first, payload(HISTORY), 10))).due > 0
    assert await q.client.zscore(KEYS.revisits, first.id) is not None
    assert await poisoned(q) == [first.id]
    assert await q.client.zscore(KEYS.dead, first.id) is not None
    assert await q.client.zscore(KEYS.revisits, first.id) is None
    await q.client.aclose()


@pytest.mark.parametrize("how", ["dead", "poison"])
@deferred_f_from_coro_f
async def test_a_requeued_revisit_holds_its_url_while_pending(redis_url, how):
    """An established entry dead-lettered (by its worker, dead.lua, or as poison, reclaim.lua)
    and then requeued (``scrapy-ha dlq requeue``) is pending again: a copy of its URL that
    finishes before it is leased ends as the double. Before, the requeue left it out of
    ``ha:{S}:revisits`` (not alive for the rule): the copy took the URL, and the requeued
    entry ended as the double at its next visit, its history lost."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    await q.enqueue([NewEntry(b"page", 0, payload())])
    first = await lease_when_due(q)
    assert (await revisit(q, end(first, payload(HISTORY), 20))).due > 0
    if how == "dead":
        gone = await lease_when_due(q)
        info = {"class": "transient", "reason": "HTTP 503 (5 failed visits in a row)"}
        assert await q.dead_letter(gone.id, gone.token, info, payload=gone.payload) == 1
    else:
        assert await poisoned(q) == [first.id]
    record = json.loads(await q.client.hget(KEYS.dead_info, first.id))
    assert record["revisits"] is True  # it was one of the revisits
    assert await q.client.zscore(KEYS.revisits, first.id) is None
    assert await q.requeue_dead([(first.id, 0, payload(HISTORY))]) == 1
    assert await q.client.zscore(KEYS.revisits, first.id) is not None
    # a copy of the URL, of a higher priority, is leased and finishes first
    await q.enqueue([NewEntry(b"copy", 10, payload())])
    copy = await lease_when_due(q)
    assert copy.id != first.id
    assert (await revisit(q, end(copy, payload({"n": 1, "f": 0}), 20))).due == DOUBLE
    again = await lease_when_due(q)
    assert again.id == first.id
    assert (await revisit(q, end(again, payload({**HISTORY, "n": 41}), 20))).due > 0
    assert await q.client.hget(KEYS.revisit_urls, b"fp-page") == first.id.encode()
    assert await q.client.zrange(KEYS.revisits, 0, -1) == [first.id.encode()]
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_requeued_request_that_was_never_revisited_stays_out_of_the_revisits(
    redis_url,
):
    """A dead letter whose entry was not one of the revisits (its first visit failed, or a
    request not revisited at all) is requeued as before: nothing is added to the set."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    await q.enqueue([NewEntry(b"page", 0, payload())])
    first = await lease_when_due(q)
    info = {"class": "gone", "reason": "HTTP 404", "revisits": True}  # (a worker's own is ignored)
    assert await q.dead_letter(first.id, first.token, info, payload=first.payload) == 1
    assert json.loads(await q.client.hget(KEYS.dead_info, first.id))["revisits"] is False
    assert await q.requeue_dead([(first.id, 0, payload())]) == 1
    assert await q.client.zcard(KEYS.revisits) == 0
    await q.client.aclose()


async def a_copy_took_the_url(q: RedisQueue, info: dict[str, str]) -> tuple[Any, Any]:
    """An established revisit entry dead-lettered (its record *info*), then a copy of its
    URL that finishes and takes the URL (the entry is not alive). Returns (entry, copy)."""
    await q.enqueue([NewEntry(b"page", 0, payload())])
    first = await lease_when_due(q)
    assert (await revisit(q, end(first, payload(HISTORY), 20))).due > 0
    gone = await lease_when_due(q)
    assert await q.dead_letter(gone.id, gone.token, info, payload=gone.payload) == 1
    await q.enqueue([NewEntry(b"copy", 0, payload())])
    copy = await lease_when_due(q)
    assert (await revisit(q, end(copy, payload({"n": 1, "f": 0}), 20))).due > 0  # took it
    return first, copy


async def poisoned(q: RedisQueue, **retention: int) -> list[str]:
    """Leases the due entry, hands it to its engine and lets its worker die: reclaim.lua
    dead-letters it as poison (*retention*: the dead-letter queue's, as ``max_entries``).
    Returns the poison ids."""
    poison: list[str] = []
    while not poison:
        leases = (await q.sync(lease=1, lease_ms=20, promote=10)).leases
        if leases:  # its worker dies while running it: handed to its engine, never renewed
            pair = (leases[0].id, leases[0].token)
            await q.renew([pair], handed=[pair], worker="w", lease_ms=20, heartbeat_ms=1000)
        await asyncio.sleep(0.03)
        reclaimed = await q.reclaim(
            worker="w", interval_ms=1, batch=10, max_expiries=1, **retention
        )
        poison = reclaimed.poison if reclaimed is not None else []
    return poison


@pytest.mark.parametrize("record", ["flagged", "older"])
@deferred_f_from_coro_f
async def test_a_requeued_revisit_takes_back_the_url_a_copy_took_while_it_was_dead(
    redis_url, record
):
    """A copy that finished while the established entry was in the dead-letter queue took
    its URL (the entry was not alive); the operator's requeue of the entry gives the URL
    back to it, and the copy ends as the double at its next finish. Before, the copy kept
    the URL and the requeued entry, with the URL's history, ended as the double. The URL
    taken says the entry was one of the revisits even where its record does not (written
    by an older version: no flag, and a fixed interval holds no share of the budget)."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    info = {"class": "transient", "reason": "HTTP 503 (5 failed visits in a row)"}
    first, copy = await a_copy_took_the_url(q, info)
    assert await q.client.hget(KEYS.revisit_urls, b"fp-page") == copy.id.encode()
    if record == "older":
        kept = json.loads(await q.client.hget(KEYS.dead_info, first.id))
        del kept["revisits"]
        await q.client.hset(KEYS.dead_info, first.id, json.dumps(kept))
    assert await q.requeue_dead([(first.id, 0, payload(HISTORY))]) == 1
    assert await q.client.hget(KEYS.revisit_urls, b"fp-page") == first.id.encode()
    assert await q.client.hkeys(KEYS.revisit_urls) == [b"fp-page"]  # the "x:" field gone
    ends = {}
    while len(ends) < 2:  # both finish once, in whichever order they come due
        lease = await lease_when_due(q)
        history = HISTORY if lease.id == first.id else {"n": 1, "f": 0}
        ends[lease.id] = (await revisit(q, end(lease, payload(history), 20))).due
    assert ends[copy.id] == DOUBLE
    assert ends[first.id] > 0
    assert await q.client.hget(KEYS.revisit_urls, b"fp-page") == first.id.encode()
    assert await q.client.zrange(KEYS.revisits, 0, -1) == [first.id.encode()]
    await q.client.aclose()


@pytest.mark.parametrize("how", ["purged", "trimmed", "trimmed by the reclaim"])
@deferred_f_from_coro_f
async def test_a_dead_letter_dropped_takes_the_url_a_copy_took_from_it_along(redis_url, how):
    """The fingerprint a copy took from a dead-lettered entry is kept for the entry's
    requeue (``x:<id>`` in ``ha:{S}:revisit_urls``); when the dead letter goes for good
    instead (``dlq purge``, or the retention of the dead-letter queue as a worker or the
    reclaim dead-letters another entry), the field goes with it. Before, it stayed until
    the crawl's finish or ``flush``: a field per such dead letter, for the life of a
    continuous crawl."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    info = {"class": "gone", "reason": "HTTP 404"}
    first, copy = await a_copy_took_the_url(q, info)
    assert await q.client.hget(KEYS.revisit_urls, f"x:{first.id}") == b"fp-page"
    if how == "purged":
        assert await q.purge_dead([first.id]) == (1, 0)
    elif how == "trimmed":  # another entry dead-lettered, one dead letter kept
        await q.enqueue([NewEntry(b"other", 0, payload())])
        other = await lease_when_due(q)
        await q.dead_letter(other.id, other.token, info, payload=other.payload, max_entries=1)
    else:
        assert len(await poisoned(q, max_entries=1)) == 1
    assert await q.client.zscore(KEYS.dead, first.id) is None  # the oldest went
    assert await q.client.hkeys(KEYS.revisit_urls) == [b"fp-page"]
    assert await q.client.hget(KEYS.revisit_urls, b"fp-page") == copy.id.encode()
    await q.client.aclose()


@pytest.mark.parametrize("order", ["oldest first", "newest first"])
@deferred_f_from_coro_f
async def test_in_a_chain_of_dead_letters_the_oldest_entry_takes_back_its_url(redis_url, order):
    """The entry dead-lettered, a copy takes its URL and is dead-lettered in turn (it
    fetches the same failing page), a second copy takes it: the operator requeues both dead
    letters. A review found the first version gave the URL to whichever was requeued last
    (the copy, with ``dlq requeue`` going oldest first), and the entry with the history
    ended as the double."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    await q.enqueue([NewEntry(b"page", 0, payload())])
    first = await lease_when_due(q)
    assert (await revisit(q, end(first, payload(HISTORY), 20))).due > 0
    info = {"class": "transient", "reason": "HTTP 503 (5 failed visits in a row)"}
    dead = [first.id]
    for name in (b"copy-1", b"copy-2"):
        holder = await lease_when_due(q)  # the URL's holder comes due: its visit fails
        assert holder.id == dead[-1]
        in_queue = await q.dead_letter(holder.id, holder.token, info, payload=holder.payload)
        assert in_queue == len(dead)
        await q.enqueue([NewEntry(name, 0, payload())])
        copy = await lease_when_due(q)
        assert (await revisit(q, end(copy, payload({"n": 1, "f": 0}), 20))).due > 0  # took it
        dead.append(copy.id)
    requeued = dead[:2] if order == "oldest first" else dead[1::-1]
    for entry_id in requeued:
        assert await q.requeue_dead([(entry_id, 0, payload())]) == 1
    assert await q.client.hget(KEYS.revisit_urls, b"fp-page") == first.id.encode()
    assert await q.client.hkeys(KEYS.revisit_urls) == [b"fp-page"]
    ends: dict[str, int] = {}
    while len(ends) < 3:  # each finishes once, in whichever order they come due
        lease = await lease_when_due(q)
        ends.setdefault(lease.id, (await revisit(q, end(lease, payload(HISTORY), 20))).due)
    assert ends[first.id] > 0
    assert ends[dead[1]] == ends[dead[2]] == DOUBLE
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_requeue_of_a_worker_made_id_gives_the_url_back_without_an_error(redis_url):
    """An entry a worker stored under its own id (``<hex>.<n>``, not a number) that a copy
    displaced while it was dead-lettered. A review found the first version compared the
    ids as numbers: the script failed half-way, the entry out of the dead-letter queue and
    in no queue (lost), the rest of the batch not counted."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    own = "0123456789abcdef.3"
    await q.client.zadd(KEYS.dead, {own: 1})
    await q.client.hset(KEYS.dead_info, own, json.dumps({"class": "gone", "revisits": True}))
    await q.client.hset(KEYS.revisit_urls, mapping={"fp-page": "5", f"x:{own}": "fp-page"})
    assert await q.requeue_dead([(own, 0, payload(HISTORY))]) == 1
    assert await q.client.hget(KEYS.revisit_urls, b"fp-page") == own.encode()
    assert await q.client.zscore(KEYS.revisits, own) is not None
    (lease,) = await q.lease(1, 30_000)
    assert lease.id == own  # pending again, in its back queue
    await q.client.aclose()


def _at(url: str) -> bytes:
    return json.dumps({"v": 1, "u": url}).encode()


@deferred_f_from_coro_f
async def test_revisits_promoted_after_a_long_stop_stay_counted_while_pending(redis_url):
    """A crawl stopped for two days: its revisits all more than a day past their due time.
    Promoted to their back queues by the first round after it, they were taken out of
    ``ha:{S}:revisits`` by the first visit that finished (pruned as gone): ``status`` said
    3 revisits of 200, and a copy of such a URL could take it over. Promotion dates them."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        urls = [f"http://a.test/{i}" for i in range(4)]
        await q.enqueue([NewEntry(f"e{i}".encode(), 0, _at(u)) for i, u in enumerate(urls)])
        for _ in range(4):
            lease = await lease_when_due(q)
            fp = f"fp-{lease.id}".encode()
            done = Revisit(lease.id, lease.token, 3_600_000, lease.payload, fp, "new", 0, "60")
            assert (await revisit(q, done)).due > 0
        ids = [m.decode() for m in await q.client.zrange(KEYS.revisits, 0, -1)]
        assert len(ids) == 4
        two_days = 2 * 86_400_000 + 3_600_000
        for key in (KEYS.delayed, KEYS.revisits):  # what a stop of two days leaves
            for member, score in await q.client.zrange(key, 0, -1, withscores=True):
                await q.client.zadd(key, {member: score - two_days})
        (first,) = (await q.sync(lease=1, lease_ms=30_000, promote=10)).leases  # 3 pending
        fp = f"fp-{first.id}".encode()
        done = Revisit(first.id, first.token, 3_600_000, first.payload, fp, "unchanged", 0, "60")
        assert (await revisit(q, done)).due > 0
        assert sorted(m.decode() for m in await q.client.zrange(KEYS.revisits, 0, -1)) == sorted(
            ids
        )
    finally:
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_revisits_promoted_in_later_rounds_after_a_long_stop_stay_counted(redis_url):
    """More revisits due after a stop of two days than a round promotes (a worker promotes
    500 a round): the first visit that finished took those still in the delayed set out of
    ``ha:{S}:revisits`` (a day past their due time), and their promotion, which dates only
    the members of the set, left them out: counted by none, and a copy of such a URL that
    finished first took it over (the established entry ended as the double)."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        urls = [f"http://a.test/{i}" for i in range(4)]
        await q.enqueue([NewEntry(f"e{i}".encode(), 0, _at(u)) for i, u in enumerate(urls)])
        fps = {}
        for _ in range(4):
            lease = await lease_when_due(q)
            fps[lease.id] = f"fp-{lease.id}".encode()
            done = Revisit(
                lease.id, lease.token, 3_600_000, lease.payload, fps[lease.id], "new", 0, "60"
            )
            assert (await revisit(q, done)).due > 0
        ids = sorted(m.decode() for m in await q.client.zrange(KEYS.revisits, 0, -1))
        assert len(ids) == 4
        two_days = 2 * 86_400_000 + 3_600_000
        for key in (KEYS.delayed, KEYS.revisits):  # what a stop of two days leaves
            for member, score in await q.client.zrange(key, 0, -1, withscores=True):
                await q.client.zadd(key, {member: score - two_days})
        # the first round promotes two of the four (its limit), and leases one
        (first,) = (await q.sync(lease=1, lease_ms=30_000, promote=2)).leases
        done = Revisit(
            first.id, first.token, 3_600_000, first.payload, fps[first.id], "unchanged", 0, "60"
        )
        assert (await revisit(q, done)).due > 0
        await q.sync(lease=1, lease_ms=30_000, promote=10)  # the other two promoted
        assert sorted(m.decode() for m in await q.client.zrange(KEYS.revisits, 0, -1)) == ids
    finally:
        await q.client.aclose()
