"""A task's checkpoint never moves past a page of its chain that has not completed: a later
page that finishes first (the earlier one still running, or waiting to retry after its item
failed in a pipeline) is kept aside until the earlier one completes or is dead-lettered.
The script against a real redis-server, and a real crawl with a failing pipeline."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.store.state import CheckpointStore
from scrapy_ha.store.wire import NewEntry
from tests.test_checkpoints import run_paged
from tests.test_queue_scripts import open_queue

if TYPE_CHECKING:
    from pathlib import Path

TTL = 60_000


def doc(of: int, page: int, **more: object) -> bytes:
    return json.dumps({"task": "t", "of": of, "page": page, **more}).encode()


@deferred_f_from_coro_f
async def test_a_later_page_never_moves_the_checkpoint_past_an_earlier_one(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([NewEntry(b"", 0, b"page")])
    (lease,) = await q.lease(1, 30000)
    save = lease.id, lease.token, "t"

    async def saved() -> dict:
        raw = await q.client.get(q.keys.checkpoint("t"))
        return json.loads(raw) if raw else {}

    # page 1 has a mid-page checkpoint; page 2 (yielded by page 1) completes while page 1 is
    # still running or waiting to retry
    assert await q.save_checkpoint(*save, doc(1, 1, skip=40, next="/list/1"), TTL)
    assert await q.save_checkpoint(*save, doc(2, 3, next="/list/3"), TTL)
    assert (await saved())["of"] == 1  # a restart begins at page 1, which has not completed
    assert await q.save_checkpoint(*save, doc(1, 1, skip=50, next="/list/1"), TTL)
    assert (await saved())["skip"] == 50  # page 1's own progress still counts
    assert await q.save_checkpoint(*save, doc(3, 4, next="/list/4", mid=0, skip=5), TTL)
    assert (await saved())["of"] == 1  # progress within a page ahead is not kept
    # page 1 completes: the checkpoint moves over every page completed after it
    assert await q.save_checkpoint(*save, doc(1, 2, next="/list/2"), TTL)
    assert (await saved())["page"] == 3 and (await saved())["next"] == "/list/3"
    assert not await q.client.exists(q.keys.checkpoint_ahead("t"))
    # page 1 run again (a late duplicate) never moves it back
    await q.save_checkpoint(*save, doc(1, 2, next="/list/2"), TTL)
    assert (await saved())["page"] == 3
    assert await q.save_checkpoint(*save, doc(3, 3, done=True), TTL)
    assert (await saved())["done"] is True
    # a finished task run again starts its chain at page 1
    assert await q.save_checkpoint(*save, doc(1, 2, next="/list/2"), TTL)
    assert (await saved())["page"] == 2
    await q.client.aclose()


async def three_pages_saved(redis_url: str) -> tuple[Any, tuple[str, str, str]]:
    """A queue whose task ``t`` saved pages 1 to 3 under one lease, and that lease's save
    arguments."""
    q = open_queue(redis_url)
    await q.enqueue([NewEntry(b"", 0, b"page")])
    (lease,) = await q.lease(1, 30000)
    save = lease.id, lease.token, "t"
    for n in (1, 2, 3):
        assert await q.save_checkpoint(*save, doc(n, n + 1, next=f"/list/{n + 1}"), TTL) == 1
    return q, save


@deferred_f_from_coro_f
async def test_a_task_whose_checkpoint_went_mid_chain_takes_the_next_page_as_it(redis_url):
    """The checkpoint expired, was evicted or reset while the chain ran: the next page that
    completes becomes the checkpoint (it waited in the ahead hash for ever, done included,
    each counted as saved), and a page behind it says so (2, never counted as saved)."""
    q, save = await three_pages_saved(redis_url)
    await q.client.delete(q.keys.checkpoint("t"))  # `checkpoints reset t`, a TTL, eviction
    assert await q.save_checkpoint(*save, doc(5, 6, next="/list/6"), TTL) == 1
    assert json.loads(await q.client.get(q.keys.checkpoint("t")))["page"] == 6
    assert await q.save_checkpoint(*save, doc(4, 5, next="/list/5"), TTL) == 2  # behind
    assert await q.save_checkpoint(*save, doc(6, 6, done=True), TTL) == 1
    assert json.loads(await q.client.get(q.keys.checkpoint("t")))["done"] is True
    assert not await q.client.exists(q.keys.checkpoint_ahead("t"))
    await q.client.aclose()


@pytest.mark.parametrize(
    "garbage", [b"garbage{", b'{"page": "x", "of": "y"}', b"[1, 2]", b'"text"', b"{}"]
)
@deferred_f_from_coro_f
async def test_a_checkpoint_unreadable_mid_chain_is_replaced_by_the_next_page(redis_url, garbage):
    """Garbage written over a task's checkpoint while its chain runs (by hand, by a bug) is
    replaced by the next page that completes, as a missing one is: before, every later page
    waited in the ahead hash for ever, the garbage stayed, the task was never done, and the
    next run crawled the whole task again from its root."""
    q, save = await three_pages_saved(redis_url)
    await q.client.set(q.keys.checkpoint("t"), garbage)
    assert await q.save_checkpoint(*save, doc(4, 5, next="/list/5"), TTL) == 1
    assert json.loads(await q.client.get(q.keys.checkpoint("t")))["page"] == 5
    assert await q.save_checkpoint(*save, doc(5, 5, done=True), TTL) == 1
    assert json.loads(await q.client.get(q.keys.checkpoint("t")))["done"] is True
    assert not await q.client.exists(q.keys.checkpoint_ahead("t"))
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_checkpoint_written_by_hand_is_saved_as_given(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([NewEntry(b"", 0, b"page")])
    (lease,) = await q.lease(1, 30000)
    assert await q.save_checkpoint(lease.id, lease.token, "t", b'{"page": 9}', TTL)
    assert await q.client.get(q.keys.checkpoint("t")) == b'{"page": 9}'
    await q.client.aclose()


def test_a_page_waiting_to_retry_holds_the_checkpoint_back(
    redis_url, redis_client, site_factory, tmp_path: Path
):
    """Items of page 2 fail in the pipeline once (a database that is down): page 2 waits in
    the delayed set while pages 3 to 5 complete; the checkpoint stays at page 2 meanwhile,
    so a restart from it would not skip page 2, and moves to the end once page 2 is done."""
    site = site_factory("--pages", "5", "--per-page", "3")
    items = tmp_path / "items.jl"
    worker = run_paged(
        redis_url,
        site.url,
        items,
        tmp_path / "run.log",
        FAIL_ITEM_ONCE="5",  # an item of page 2
        ADDONS='{"scrapy_ha.Addon": 0}',
        HA_RETRY_JITTER="0",
        HA_RETRY_POLICIES='{"pipeline": {"base": 4, "max": 4}}',
    )
    deadline = time.monotonic() + 60
    while not (stored(items) >= set(range(13, 16)) and redis_client.zcard("ha:{paged}:delayed")):
        assert worker.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "page 5 never crawled while page 2 waited"
        time.sleep(0.05)
    while redis_client.zcard("ha:{paged}:leased"):  # page 5 acked
        assert time.monotonic() < deadline and redis_client.zcard("ha:{paged}:delayed")
        time.sleep(0.05)
    assert redis_client.zcard("ha:{paged}:delayed") == 1, "page 2 retried too soon to check"
    (key,) = redis_client.keys("ha:{paged}:cp:*")
    held = json.loads(redis_client.get(key))
    assert not held.get("done") and held["page"] == 2, held
    assert json.loads(held["next"])["u"].endswith("/list/2")
    assert worker.wait(timeout=120) == 0, (tmp_path / "run.log").read_text()[-3000:]
    final = json.loads(redis_client.get(key))
    assert final["done"] is True and final["page"] == 5, final
    assert stored(items) == set(range(1, 16))


def test_a_dead_lettered_page_holds_its_chain_back_no_more(
    redis_url, redis_client, site_factory, tmp_path: Path
):
    """An item of page 2 fails every time: page 2 ends in the dead-letter queue, and the
    checkpoint moves past it to the end of the chain (the page waits in the DLQ)."""
    site = site_factory("--pages", "4", "--per-page", "3")
    items = tmp_path / "items.jl"
    worker = run_paged(
        redis_url,
        site.url,
        items,
        tmp_path / "run.log",
        FAIL_ITEM_ALWAYS="5",
        ADDONS='{"scrapy_ha.Addon": 0}',
        HA_RETRY_JITTER="0",
        HA_RETRY_POLICIES='{"pipeline": {"times": 1, "base": 0.5, "max": 0.5}}',
    )
    assert worker.wait(timeout=120) == 0, (tmp_path / "run.log").read_text()[-3000:]
    (dead,) = redis_client.zrange("ha:{paged}:dead", 0, -1)
    assert json.loads(redis_client.hget("ha:{paged}:dead_info", dead))["class"] == "pipeline"
    (key,) = redis_client.keys("ha:{paged}:cp:*")
    final = json.loads(redis_client.get(key))
    assert final["done"] is True and final["page"] == 4, final
    assert stored(items) == set(range(1, 13)) - {5}
    assert redis_client.keys("ha:{paged}:cpa:*") == []


@deferred_f_from_coro_f
async def test_resetting_a_checkpoint_drops_the_pages_kept_aside(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([NewEntry(b"", 0, b"page")])
    (lease,) = await q.lease(1, 30000)
    await q.save_checkpoint(lease.id, lease.token, "t", doc(1, 1, skip=1, next="/list/1"), TTL)
    await q.save_checkpoint(lease.id, lease.token, "t", doc(2, 3, next="/list/3"), TTL)
    assert await q.client.exists(q.keys.checkpoint_ahead("t"))
    # pages kept aside expire as the checkpoint does: a task given up leaves nothing for ever
    assert 0 < await q.client.pttl(q.keys.checkpoint_ahead("t")) <= TTL
    assert await CheckpointStore(q.client, q.keys).delete(["t"]) == 1
    assert not await q.client.exists(q.keys.checkpoint_ahead("t"), q.keys.checkpoint("t"))
    await q.client.aclose()


def stored(items: Path) -> set[int]:
    if not items.exists():
        return set()
    return {json.loads(line)["id"] for line in items.read_text().splitlines()}
