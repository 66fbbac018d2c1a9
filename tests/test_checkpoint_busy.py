"""Mid-page checkpoints keep up with a pipeline that keeps the event loop busy (a
synchronous database client, 2 ms an item): every HA_CHECKPOINT_ITEMS items a save was
queued, and they went to Redis one round trip each, a few a second while the pipeline
did hundreds of items: the checkpoint fell ever further behind (466 items written, 20 in
the checkpoint, in a QA run), and a kill re-emitted hundreds of items. A save of a page
supersedes its earlier ones not sent yet (real redis-server, a real crawl, SIGKILL)."""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING

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
