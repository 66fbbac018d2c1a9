"""The background task's wake-ups: a wake is never lost, and an idle task does not spin.

The loop under test is :meth:`Session._run`; its rounds are stand-ins that record when they
run (what a round does against Redis is covered by the crawl tests)."""

from __future__ import annotations

import asyncio

from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.scheduler.session.session import Session
from tests.test_scheduler_shell import shell

#: The tick of these tests: far longer than any test may take, so a round that runs before
#: it was woken, not timed out.
LONG_TICK = 60.0


class RecordingSession(Session):
    """Rounds that record themselves; the first one is woken while it runs (as the engine
    does when it takes a request or a callback yields one during a round trip)."""

    def __init__(self, *args, wake_during_first: bool) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args)
        self.rounds = 0
        self.wake_during_first = wake_during_first
        self.second = asyncio.get_running_loop().create_future()

    async def _round(self) -> bool:
        self.rounds += 1
        if self.rounds == 1 and self.wake_during_first:
            await asyncio.sleep(0)  # the round's own await (the script call)
            self.wake()
            await asyncio.sleep(0)
        if self.rounds == 2 and not self.second.done():
            self.second.set_result(None)
        return False


async def _second_round(wake_during_first: bool, within: float) -> bool:
    scheduler, _, _ = shell(tick=LONG_TICK)
    session = RecordingSession(scheduler, wake_during_first=wake_during_first)
    session.start()
    try:
        await asyncio.wait_for(asyncio.shield(session.second), within)
        return True
    except TimeoutError:
        return False
    finally:
        session.stopping = True
        session.wake()
        assert session._task is not None
        session._task.cancel()
        session.heap.thaw()  # what close() does first: no freeze or sweep outlives the test
        session.sweep.stop()


@deferred_f_from_coro_f
async def test_a_wake_that_comes_during_a_round_runs_the_next_round_at_once():
    """Before: the loop cleared the wake-up event after the round, before waiting, so a wake
    that came during the round was lost and the next round waited a whole tick."""
    assert await _second_round(wake_during_first=True, within=10.0)


@deferred_f_from_coro_f
async def test_without_a_wake_the_task_waits_for_its_tick():
    assert not await _second_round(wake_during_first=False, within=0.5)


@deferred_f_from_coro_f
async def test_the_last_finished_request_is_acked_when_the_engine_goes_idle(redis_url, site):
    """The engine going idle wakes the background task, so a finished crawl acks its last
    pages and closes without waiting for the task's tick. Before: the last acks waited for
    the tick (here a minute: the crawl hit CLOSESPIDER_TIMEOUT instead of finishing)."""
    from scrapy.utils.test import get_crawler

    from tests.spiders import CatalogueSpider

    settings = {
        "SCHEDULER": "scrapy_ha.Scheduler",
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.3,
        "HA_TICK": LONG_TICK,
        "CLOSESPIDER_TIMEOUT": 30,
    }
    crawler = get_crawler(CatalogueSpider, settings)
    await crawler.crawl_async(base_url=site.url)
    assert crawler.stats.get_value("finish_reason") == "finished"
    assert sorted(i["id"] for i in crawler.spider.items) == list(range(1, 51))
