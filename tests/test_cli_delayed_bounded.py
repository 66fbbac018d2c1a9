"""``scrapy-ha delayed list --limit N`` and ``retry-now ID`` on a large delayed set: they
read what they show (a batch, or the ids named), not the whole set. A continuous crawl
keeps every revisited URL there: with 100,000 of them, ``delayed list --limit 10`` read
them all (2 s and 50 MB more here; 1 M: ten times that) to print ten lines."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.cli.delayed import BATCH
from tests.cli_seed import delayed, scrapy_ha
from tests.test_shards import entry, lease_all, sharded

if TYPE_CHECKING:
    import redis

    from scrapy_ha.store.shards import ShardedQueue

HOUR = 3600_000


def _calls(client: redis.Redis, command: str) -> int:
    return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_delayed_list_with_a_limit_reads_one_batch_of_a_large_set(redis_url, redis_client):
    n = 3 * BATCH + 1
    rows = [(f"http://a.example/{i}", HOUR + 1000 * i, "server") for i in range(n)]
    rows[-1] = ("http://b.example/last", HOUR + 1000 * n, "network")
    ids = delayed(redis_url, "books", rows)
    redis_client.config_resetstat()
    listed = scrapy_ha("delayed", "list", "books", "--limit", "3", "--redis-url", redis_url)
    assert listed.returncode == 0, listed.stderr
    out = listed.stdout.splitlines()
    assert [line.split()[-1] for line in out[1:-1]] == [u for u, _, _ in rows[:3]]
    assert out[-1] == "3 delayed requests listed (3 retries)"
    assert _calls(redis_client, "zrangebyscore") == 1  # one batch read, of the 4 the set holds
    # a filter reads on until the limit is met: the one match is the last entry
    redis_client.config_resetstat()
    only = scrapy_ha(
        "delayed", "list", "books", "--class", "network", "--limit", "1", "--redis-url", redis_url
    )
    assert only.stdout.splitlines()[1].split()[-1] == "http://b.example/last"
    assert _calls(redis_client, "zrangebyscore") == 7  # the first, then 2 a batch after it
    # one id made due: read by its id, not the set
    redis_client.config_resetstat()
    cli = ("delayed", "retry-now", "books", ids[7], "--yes", "--redis-url", redis_url)
    done = scrapy_ha(*cli)
    assert done.stdout.startswith("made 1 of 1 delayed request of books due now"), done.stderr
    assert _calls(redis_client, "zrange") + _calls(redis_client, "zrangebyscore") == 0
    assert redis_client.zcard("ha:{books}:delayed") == n
    missing = scrapy_ha(
        "delayed", "retry-now", "books", "999999", "--yes", "--redis-url", redis_url
    )
    assert missing.returncode == 1, missing.stderr
    assert "no delayed request 999999 in books" in missing.stderr


@deferred_f_from_coro_f
async def test_delayed_entries_of_every_shard_come_merged_soonest_first(redis_url):
    from scrapy_ha.cli.delayed import in_order

    q = sharded(redis_url, shards=3)
    await q.sync(enqueue=[entry(f"u{i}") for i in range(30)])
    leases = await lease_all(q)
    for i, x in enumerate(leases):  # due times interleaved across the shards
        assert await q.retry_later(x.id, x.token, HOUR + 997 * ((i * 7) % 30), x.payload, 0, "s")
    listed = [d async for d in in_order(q)]
    assert sorted(d.id for d in listed) == sorted(x.id for x in leases)
    assert [d.due_ms for d in listed] == sorted(d.due_ms for d in listed)
    assert len({q.route(d.id)[0] for d in listed}) == 3
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_entries_made_due_meanwhile_shift_no_other_out_of_the_listing(redis_url):
    """Workers promote the soonest entries while a listing reads on (a pager, a slow pipe,
    the merge of shards): read by rank, every later entry moved up past the next batch's
    first rank, and as many as were promoted were never listed, one already listed came
    again (a review: 100 of 1,200 missed, one twice)."""
    from scrapy_ha.cli.delayed import in_order

    q, n = await _two_shards_delayed(redis_url)
    listed, promoted = [], []
    async for d in in_order(q):
        listed.append(d.id)
        if len(listed) == BATCH:  # a batch listed: workers promote 100 of each shard's head
            for shard in q.shards:
                promoted += [m for m, _ in await q.client.zpopmin(shard.keys.delayed, 100)]
                # and the last of the shard's batch read, not listed yet (it is, from the
                # batch): the next batch starts past where it was
                last = await q.client.zrange(shard.keys.delayed, BATCH - 101, BATCH - 101)
                promoted += last
                await q.client.zrem(shard.keys.delayed, *last)
    assert len(promoted) == 202
    assert len(listed) == len(set(listed)) == n  # each entry once, none shifted out
    await q.client.aclose()


@pytest.mark.parametrize("moved", ["later", "sooner"])
@deferred_f_from_coro_f
async def test_the_last_entry_read_due_again_elsewhere_moves_no_other(redis_url, moved):
    """The last entry a batch read is due again at another time meanwhile (leased and
    retried later; made due by another command): the next batch began after its new place
    (a review: 700 of 1,200 never read; or 499 read twice)."""
    from scrapy_ha.cli.delayed import in_order

    q, n = await _two_shards_delayed(redis_url)
    listed = []
    async for d in in_order(q):
        listed.append(d.id)
        if len(listed) == BATCH:  # each shard's batch read: its last entry moves
            for shard in q.shards:
                last = await q.client.zrange(shard.keys.delayed, BATCH - 1, BATCH - 1)
                due = HOUR + 1000 * (n + 1) if moved == "later" else 1
                await q.client.zadd(shard.keys.delayed, {last[0]: due})
    assert set(listed) == {d.id async for d in in_order(q)}  # every entry read
    assert len(listed) <= n + 2  # and none twice but the two that moved behind the reading
    await q.client.aclose()


async def _two_shards_delayed(redis_url: str) -> tuple[ShardedQueue, int]:
    """A crawl of 2 shards whose delayed sets hold 4 batches and more, due a second apart."""
    q = sharded(redis_url, shards=2)
    n = 4 * BATCH + 400
    await q.sync(enqueue=[entry(f"u{i}") for i in range(n)])
    for i, x in enumerate(await lease_all(q)):
        assert await q.retry_later(x.id, x.token, HOUR + 1000 * i, x.payload, 0, "s")
    return q, n


class _PromotedAtTheRead:
    """A shard's real client, and a worker that promotes the 100 soonest delayed entries
    just as the listing reads its second batch (after it found where that batch begins)."""

    def __init__(self, client: Any, key: str) -> None:
        self._client, self._key, self.reads = client, key, 0
        self.promoted: list[bytes] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def _batch_read(self) -> None:
        self.reads += 1
        if self.reads == 2:
            self.promoted += [m for m, _ in await self._client.zpopmin(self._key, 100)]

    async def zrange(self, *args: Any, **kwargs: Any) -> Any:
        await self._batch_read()
        return await self._client.zrange(*args, **kwargs)

    async def zrangebyscore(self, *args: Any, **kwargs: Any) -> Any:
        await self._batch_read()
        return await self._client.zrangebyscore(*args, **kwargs)

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        pipe = self._client.pipeline(*args, **kwargs)
        execute = pipe.execute

        async def read(*a: Any, **k: Any) -> Any:
            if any(command[0][0] == "ZRANGEBYSCORE" for command in pipe.command_stack):
                await self._batch_read()
            return await execute(*a, **k)

        pipe.execute = read
        return pipe


@deferred_f_from_coro_f
async def test_entries_promoted_as_the_next_batch_is_read_shift_no_other_out(redis_url):
    """The rank of the next batch was found, then workers promoted entries before the read
    at that rank: as many entries as were promoted were never listed (100 after each of the
    first batches, 200 of 2,400 here). Read by score after the last entry, none is."""
    from scrapy_ha.cli.delayed import in_order

    q, n = await _two_shards_delayed(redis_url)
    racing = []
    for shard in q.shards:
        racing.append(_PromotedAtTheRead(shard.client, shard.keys.delayed))
        shard.client = racing[-1]
    listed = [d.id async for d in in_order(q)]
    assert sum(len(r.promoted) for r in racing) == 200  # of the first batches, listed before
    assert len(listed) == len(set(listed))
    assert len(listed) == n, f"{n - len(listed)} never listed"
    for r in racing:
        await r._client.aclose()
