"""What the scheduler counts per download slot (scheduler.engine.slots.SlotLoad) keeps no finished
request alive for long: a slot no longer asked about is swept every SLOT_SWEEP_EVERY
hand-outs, or as many as the last sweep kept, whichever is more."""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace

from scrapy import Request

from scrapy_ha.scheduler.engine.slots import SlotLoad
from tests.test_scheduler_shell import FakeEngine


def _load() -> tuple[SlotLoad, SimpleNamespace, FakeEngine]:
    engine = FakeEngine()
    engine.downloader.get_slot_key = lambda request: request.meta["slot"]
    return SlotLoad(), SimpleNamespace(engine=engine), engine


def test_a_slot_no_longer_asked_about_keeps_its_finished_requests_a_few_hundred_hand_outs():
    load, crawler, _ = _load()
    finished = Request("http://a.test/", meta={"slot": "a"})
    ref = weakref.ref(finished)
    load.handed(crawler, finished)  # downloaded and done; slot "a" is never asked again
    del finished
    for n in range(200):  # each finishes at once, in another slot
        load.handed(crawler, Request(f"http://b.test/{n}", meta={"slot": "b"}))
    gc.collect()
    assert ref() is None
    assert load.load(crawler, "a") == 0


def test_a_sweep_waits_for_as_many_hand_outs_as_it_kept_requests():
    # many downloads in flight: sweeping them all every SLOT_SWEEP_EVERY hand-outs would
    # cost more than a check per hand-out, so the next sweep waits as long as it kept
    load, crawler, engine = _load()
    running = [Request(f"http://b.test/{n}", meta={"slot": "b"}) for n in range(300)]
    engine.downloader.active.update(running)
    for request in running:
        load.handed(crawler, request)  # swept at 200: all 200 kept (still running)
    finished = Request("http://a.test/", meta={"slot": "a"})
    ref = weakref.ref(finished)
    load.handed(crawler, finished)  # 101st since the sweep
    del finished
    for n in range(98):
        load.handed(crawler, Request(f"http://c.test/{n}", meta={"slot": "c"}))
    gc.collect()
    assert ref() is not None  # 199 hand-outs since the sweep, which kept 200
    load.handed(crawler, Request("http://c.test/last", meta={"slot": "c"}))
    gc.collect()
    assert ref() is None
    assert load.load(crawler, "b") == 300


def test_a_sweep_keeps_the_request_being_handed_out():
    # the engine puts a request in the downloader's active set after the hand-out: the
    # sweep that hand-out sets off must still count it on its way to its slot
    load, crawler, engine = _load()
    for n in range(199):
        request = Request(f"http://b.test/{n}", meta={"slot": "b"})
        load.handed(crawler, request)
        engine.downloader.active.add(request)
    on_its_way = Request("http://a.test/", meta={"slot": "a"})
    load.handed(crawler, on_its_way)  # the 200th: the sweep
    engine.downloader.active.add(on_its_way)
    assert load.load(crawler, "a") == 1
