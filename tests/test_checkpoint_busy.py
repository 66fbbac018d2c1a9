"""Mid-page checkpoints keep up with a pipeline that keeps the event loop busy (a
synchronous database client, 2 ms an item): every HA_CHECKPOINT_ITEMS items a save was
queued, and they went to Redis one round trip each, a few a second while the pipeline
did hundreds of items: the checkpoint fell ever further behind (466 items written, 20 in
the checkpoint, in a QA run), and a kill re-emitted hundreds of items. A save of a page
supersedes its earlier ones not sent yet (real redis-server, a real crawl, SIGKILL)."""

from __future__ import annotations

import signal
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING

import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.outbox import CheckpointSave, Outbox
from scrapy_ha.scheduler.session.sync import Syncer
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry
from tests.test_checkpoints import checkpoint, count, run_paged

if TYPE_CHECKING:
    from pathlib import Path

#: Items of the one page, and where the worker is killed in it (items written).
PER_PAGE, KILL_AT = 1500, 1200
#: Items written the checkpoint may lag by when the worker is killed: the items done
#: while its last save was on its way (a round trip through an event loop kept busy).
#: Before, the lag grew with the page: about 1,100 at the kill.
MOST_BEHIND = 400


def test_a_busy_pipeline_does_not_leave_the_mid_page_checkpoint_behind(
    redis_url, redis_client, site_factory, tmp_path: Path
):
    site = site_factory("--pages", "1", "--per-page", str(PER_PAGE))
    items = tmp_path / "items.jl"
    worker = run_paged(
        redis_url,
        site.url,
        items,
        tmp_path / "worker.log",
        HA_CHECKPOINT_ITEMS="5",
        BLOCK_ITEM_S="0.002",
    )
    deadline = time.monotonic() + 120
    while count(items) < KILL_AT:
        assert worker.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    written, saved = count(items), checkpoint(redis_client)
    print("written", written, "checkpointed", saved.get("skip"))
    assert saved["page"] == 1 and not saved["done"], saved
    assert written - saved["skip"] <= MOST_BEHIND, (written, saved["skip"])


class _PageRunsDuringTheSave(RedisQueue):
    """The real queue; while the first save is on its way, the page's callback yields a
    link and passes more items (their save queued behind a child not sent yet)."""

    outbox: Outbox

    async def save_checkpoint(self, entry_id, token, task, doc, ttl_ms):  # type: ignore[override]
        saved = await super().save_checkpoint(entry_id, token, task, doc, ttl_ms)
        if doc == b'{"skip": 10}':
            self.outbox.children.append(NewEntry(b"fp", 0, b"child"))
            self.outbox.checkpoints.append(
                CheckpointSave(entry_id, token, task, b'{"skip": 20}', ttl_ms)
            )
        return saved


@deferred_f_from_coro_f
async def test_a_save_queued_during_the_sends_waits_for_its_pages_children(redis_url):
    """A checkpoint never runs ahead of the queue: a save queued while the saves went (its
    page's children not sent yet) waits for the next round, after them (a review: it went
    in the same loop, the children still in the outbox)."""
    queue = _PageRunsDuringTheSave(redis.asyncio.Redis.from_url(redis_url), Keys("ha", "busy"))
    await queue.enqueue([NewEntry(b"", 0, b"page")])
    (page,) = await queue.lease(1, 30000)
    syncer = object.__new__(Syncer)
    syncer.outbox = queue.outbox = Outbox()
    syncer.stats = get_crawler().stats
    syncer.ends = SimpleNamespace(queue=queue)
    syncer.outbox.checkpoints.append(
        CheckpointSave(page.id, page.token, "t", b'{"skip": 10}', 60000)
    )
    await syncer.save_checkpoints()
    assert await queue.client.get(queue.keys.checkpoint("t")) == b'{"skip": 10}'
    assert [cp.doc for cp in syncer.outbox.checkpoints] == [b'{"skip": 20}']  # next round
    await queue.client.aclose()
