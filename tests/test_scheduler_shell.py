"""The scheduler's shell against a fake session: what the engine calls, answered from memory.

The shell's contract with its session is scrapy-ha's own (an Outbox the shell fills, leases
handed in through ``Scheduler.take``), so a fake session is the right stand-in here: these
tests need no Redis and no reactor. The engine is a stand-in too, holding only the sets
:mod:`scrapy_ha.scheduler.engine` reads; the real ones are covered by the crawl tests.
"""

from __future__ import annotations

import dataclasses
import math
import time
from types import SimpleNamespace
from typing import Any

import pytest
from scrapy import Request, Spider
from scrapy.exceptions import DontCloseSpider
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f, maybe_deferred_to_future
from scrapy.utils.test import get_crawler

from scrapy_ha import metakeys
from scrapy_ha.codec import decode_request
from scrapy_ha.config.continuous import RevisitConfig, RevisitState
from scrapy_ha.config.scheduler import SchedulerConfig
from scrapy_ha.scheduler import gate as gate_module
from scrapy_ha.scheduler.outbox import EndOp
from scrapy_ha.scheduler.remote import Remote
from scrapy_ha.scheduler.session.renewal import Renewals
from scrapy_ha.scheduler.shell import Scheduler
from scrapy_ha.store.wire import Lease
from scrapy_ha.verdict import FailureClass, Verdict


class FakeSession:
    """What the shell reads and calls on its session, and nothing else."""

    def __init__(self, shell: Scheduler) -> None:
        self.shell = shell
        self.queue = None
        self.stopping = False
        self.redis_ok = True
        self.remote = Remote(active=0)
        self.renewals = Renewals(
            shell.crawler.settings, SchedulerConfig, tuple, lambda lost: None, shell.inflight.pairs
        )
        self.renewals.valid_until = math.inf
        self.start_urls = SimpleNamespace(feed_mode=False)
        self.wakes = 0
        self.closed: dict[str, Any] | None = None

    def wake(self) -> None:
        self.wakes += 1

    def holds_unreadable(self) -> bool:
        return False

    async def open(self, spider: Spider) -> bool:
        return True

    def start(self) -> None:
        pass

    def closing(self) -> None:
        pass

    async def close(self, reason: str) -> None:
        """What the real session sends at close: the outbox, then every local lease."""
        self.shell.inflight.collect_finished()
        box = self.shell.outbox
        self.closed = {
            "children": [e.payload for e in box.children],
            "acks": list(box.acks),
            "released": self.shell.local_leases() + box.releases,
        }
        self.shell.forget_local()

    def hand(self, url: str, entry_id: str, *, priority: int = 0, expiries: int = 0) -> Request:
        """Lease a request into the shell, as a sync's reply would."""
        request = Request(url, priority=priority)
        self.shell.take(request, Lease(entry_id, f"t-{entry_id}", b"", expiries))
        return request


class ShellUnderTest(Scheduler):
    session_class = FakeSession


class FakeEngine:
    """The engine state :mod:`scrapy_ha.scheduler.engine` reads: a request is unfinished while it
    is in ``downloader.active``; no download slot is busy."""

    def __init__(self) -> None:
        self.downloader = SimpleNamespace(
            active=set(),
            slots={},
            get_slot_key=lambda request: "slot",
            ip_concurrency=0,
            domain_concurrency=8,
            per_slot_settings={},
        )
        self.scraper = SimpleNamespace(slot=None)
        self._slot = SimpleNamespace(
            inprogress=set(), nextcall=SimpleNamespace(schedule=lambda: None)
        )


def shell(**config: Any) -> tuple[Scheduler, FakeSession, FakeEngine]:
    crawler = get_crawler(Spider)
    crawler._apply_settings()
    engine = FakeEngine()
    crawler.engine = engine  # type: ignore[assignment]
    crawler.stats.open_spider()
    scheduler = ShellUnderTest(crawler, SchedulerConfig(**config))
    scheduler.spider = Spider("shell")
    assert isinstance(scheduler.session, FakeSession)
    return scheduler, scheduler.session, engine


def test_enqueued_requests_go_to_the_outbox_in_order_with_their_parent():
    s, session, _ = shell()
    urls = [f"http://a.test/{n}" for n in range(5)]
    s.inflight.add("7", "t-7", Request("http://a.test/list"), stored=False)  # their page
    for url in urls:
        child = Request(url, meta={metakeys.PARENT: ("7", "t-7")})
        assert s.enqueue_request(child)
    box = s.outbox
    assert [decode_request(e.payload, s.spider).url for e in box.children] == urls
    assert {e.parent for e in box.children} == {("7", "t-7")}
    assert session.wakes == 5  # each one wakes the session: nothing waits on a timer
    assert s.has_pending_requests() and len(s) == 5
    assert box.acks == [] and box.ends == []


def test_a_duplicate_is_dropped_before_the_outbox():
    s, _, _ = shell()
    assert s.enqueue_request(Request("http://a.test/1"))
    assert not s.enqueue_request(Request("http://a.test/1"))
    assert s.enqueue_request(Request("http://a.test/1", dont_filter=True))
    assert len(s.outbox.children) == 2
    assert s.stats.get_value("ha/filtered") == 1


def test_leases_handed_in_come_out_by_priority_then_lease_order():
    s, session, _ = shell()
    low = session.hand("http://a.test/low", "1", priority=0)
    high = session.hand("http://a.test/high", "2", priority=5)
    mid = session.hand("http://a.test/mid", "3", priority=1)
    low2 = session.hand("http://a.test/low2", "4", priority=0)
    assert len(s) == 4 and s.has_pending_requests()
    got = [s.next_request() for _ in range(5)]
    assert got == [high, mid, low, low2, None]
    assert high.meta[metakeys.LEASE] == ("2", "t-2")
    assert s.local_leases() == [("2", "t-2"), ("3", "t-3"), ("1", "t-1"), ("4", "t-4")]
    assert not s.has_pending_requests() and len(s) == 0


def test_nothing_is_handed_out_once_the_leases_may_have_expired():
    s, session, _ = shell()
    session.hand("http://a.test/1", "1")
    session.renewals.valid_until = time.monotonic() - 1
    wakes = session.wakes
    assert s.next_request() is None
    assert session.wakes == wakes + 1  # the session is asked to renew


def test_a_finished_request_is_acked_and_a_retried_one_ended_with_its_copys_priority():
    s, session, engine = shell()
    done = session.hand("http://a.test/done", "1")
    retried = session.hand("http://a.test/retried", "2")
    assert s.next_request() is done and s.next_request() is retried
    engine.downloader.active.update({done, retried})
    retried.meta[metakeys.OUTCOME] = Verdict.retry(FailureClass.SERVER, "HTTP 500", delay=3)
    copy = retried.replace(priority=-1)
    assert s.enqueue_request(copy)  # the copy is not queued: the original's lease moves
    assert s.outbox.children == []
    s.inflight.collect_finished()
    assert s.outbox.acks == [] and s.outbox.ends == []  # both still in the engine
    engine.downloader.active.clear()
    s.inflight.collect_finished()
    assert s.outbox.acks == [("1", "t-1")]
    assert s.outbox.ends == [EndOp("retry", "2", "t-2", retried, 0.0, -1)]


def test_a_retry_copy_taken_in_place_of_an_early_download_clears_the_gate():
    """InFlight.kin tells the download gate (on_retry) when a copy is taken as the retry of
    a request in flight: what the gate held for that request's early download is dropped."""
    s, session, _ = shell()
    retried = session.hand("http://a.test/retried", "2")
    assert s.next_request() is retried
    gate, pair = s.handout.gate, ("2", "t-2")
    gate._waiting[pair] = gate_module._EARLY  # downloading early, verdict not known
    gate._early.add(pair)
    retried.meta[metakeys.OUTCOME] = Verdict.retry(FailureClass.SERVER, "HTTP 500", delay=3)
    assert s.enqueue_request(retried.replace(priority=-1))
    assert pair not in gate._early and pair not in gate._waiting
    assert s.outbox.children == []


def test_a_late_request_is_queued_as_a_root_and_counted_once_admitted():
    """A request naming a page this worker already finished (its meta copied) is queued as
    a new root, counted in ha/late_requests; a duplicate of it is filtered, not counted."""
    s, _, _ = shell()
    late = Request("http://a.test/late", meta={metakeys.PARENT: ("9", "t-9")})
    assert s.enqueue_request(late)
    assert s.outbox.children[-1].parent is None
    assert s.stats.get_value("ha/late_requests") == 1
    again = Request("http://a.test/late", meta={metakeys.PARENT: ("9", "t-9")})
    assert not s.enqueue_request(again)
    assert s.stats.get_value("ha/late_requests") == 1


def test_finished_requests_whose_acks_are_on_their_way_hold_the_engine_back():
    """Requests finish and are replaced while a round is out, and their leases stay in
    Redis until a round acks them: once the requests handed out that hold a lease
    (unfinished, or finished and not acked yet) reach ``max_unacked`` (HA_MAX_INFLIGHT +
    CONCURRENT_REQUESTS), nothing more goes out until that round, which wakes the engine
    (``held_back``). Else what a killed worker leaves to redo grew with the round's length:
    up to 95 leases held against 64 in tests/test_crash.py."""
    config = SchedulerConfig.from_settings(
        Settings({"CONCURRENT_REQUESTS": 2, "HA_MAX_INFLIGHT": 4})
    )
    s, session, engine = shell(
        **{f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    )
    for n in range(10):
        session.hand(f"http://a.test/{n}", str(n))
    first = [s.next_request() for _ in range(4)]
    engine.downloader.active.update(first)
    assert None not in first and s.next_request() is None  # HA_MAX_INFLIGHT unfinished
    engine.downloader.active.clear()  # the four finished: their acks wait for a round
    more = [s.next_request() for _ in range(2)]
    engine.downloader.active.update(more)
    assert None not in more and len(s.outbox.acks) == 4
    wakes = session.wakes
    assert s.next_request() is None  # 2 unfinished + 4 finished, their leases in Redis
    assert s.outbox.held_back and session.wakes == wakes + 1  # the round wakes the engine
    assert s.stats.get_value("ha/waited_for_acks") == 1
    assert s.empty_on_the_way()  # no scheduler_empty: the round is on its way
    s.outbox.acks.clear()  # the round acked them
    s.outbox.held_back = False
    assert s.next_request() is not None


def test_scheduler_empty_waits_while_requests_wait_in_the_buffer():
    """The engine asks while HA_MAX_INFLIGHT requests are unfinished (responses waiting in
    the scraper leave the downloader room): None, but the buffer holds requests, so the
    scheduler is not empty (a lazy start spider would be fed while they wait)."""
    s, session, engine = shell(max_inflight=2)
    session.remote.pending = 0
    for n in range(3):
        session.hand(f"http://a.test/{n}", str(n))
    engine.downloader.active.update(s.next_request() for _ in range(2))
    assert s.next_request() is None and s.buffered() == 1
    assert s.empty_on_the_way()
    engine.downloader.active.clear()
    assert s.next_request() is not None and not s.empty_on_the_way()  # empty now


def test_a_suspect_runs_alone():
    s, session, engine = shell()
    busy = session.hand("http://a.test/busy", "1", priority=9)
    assert s.next_request() is busy
    engine.downloader.active.add(busy)
    suspect = session.hand("http://b.test/suspect", "2", priority=5, expiries=2)
    other = session.hand("http://c.test/other", "3")
    assert suspect.meta[metakeys.SUSPECT] == 2  # its last chance before the dead letters
    assert s.next_request() is None  # waits for the engine to empty, first in line
    assert s.want() > 0
    engine.downloader.active.clear()  # busy finished
    assert s.next_request() is None  # Redis must know it runs before it runs
    assert s.outbox.releases == [("3", "t-3")]  # the rest of the buffer given back
    assert s.local_leases() == [("2", "t-2")] and s.want() == 0
    assert session.renewals.due(time.monotonic())  # the next round renews at once
    assert ("2", "t-2") in session.renewals._handed_now()  # and reports it handed out
    assert s.next_request() is None and s.want() == 0  # still waiting
    session.renewals._confirm([("2", "t-2")], [])  # that renewal went through
    assert s.next_request() is suspect
    assert s.local_leases() == [("2", "t-2")] and s.want() == 0
    assert other.meta[metakeys.LEASE] == ("3", "t-3")
    engine.downloader.active.add(suspect)
    session.hand("http://c.test/later", "4")
    assert s.next_request() is None  # nothing runs beside it
    engine.downloader.active.clear()
    assert s.next_request() is not None  # alone no more


def test_a_closed_domain_defers_its_request():
    s, session, _ = shell()
    gated = session.hand("http://gated.test/1", "1", priority=1)
    free = session.hand("http://free.test/1", "2")
    s.close_gate(Request("http://gated.test/x"), 30)
    assert s.outbox.gates == {"gated.test": 30}
    assert s.next_request() is free
    (op,) = s.outbox.ends
    assert (op.kind, op.entry_id, op.request) == ("defer", "1", gated) and 29 < op.delay <= 30


def test_pending_and_len_count_buffer_outbox_and_redis():
    s, session, _ = shell()
    assert not s.has_pending_requests() and len(s) == 0
    session.remote.waiting = 3
    assert s.has_pending_requests() and len(s) == 3
    s.enqueue_request(Request("http://a.test/1"))
    session.hand("http://a.test/2", "2")
    assert len(s) == 5


@deferred_f_from_coro_f
async def test_close_flushes_acks_and_releases_what_is_held():
    s, session, engine = shell()
    done = session.hand("http://a.test/done", "1")
    running = session.hand("http://a.test/running", "2")
    session.hand("http://a.test/buffered", "3")
    assert s.next_request() is done and s.next_request() is running
    engine.downloader.active.add(running)
    s.enqueue_request(Request("http://a.test/child"))
    await maybe_deferred_to_future(s.close("shutdown"))
    assert session.closed is not None
    assert len(session.closed["children"]) == 1
    assert session.closed["acks"] == [("1", "t-1")]
    assert sorted(session.closed["released"]) == [("2", "t-2"), ("3", "t-3")]
    assert s.local_leases() == []


def test_the_idle_spider_stays_open_while_anything_is_local():
    s, session, _ = shell()
    session.remote.engine_view = (False, False)
    s.idle.on_idle()  # nothing anywhere, no peers: may close
    s.enqueue_request(Request("http://a.test/1"))
    with pytest.raises(DontCloseSpider):
        s.idle.on_idle()


def test_a_finished_request_with_a_verdict_of_the_users_own_is_ended_or_acked_never_lost():
    s, session, engine = shell()
    odd = session.hand("http://a.test/odd", "1")
    unknown_op = session.hand("http://a.test/unknown-op", "2")
    assert s.next_request() is odd and s.next_request() is unknown_op
    odd.meta[metakeys.OUTCOME] = {"op": "dead", "class": "captcha"}
    unknown_op.meta[metakeys.OUTCOME] = {"op": "ack", "class": "banned"}
    s.inflight.collect_finished()
    assert len(s.inflight) == 0
    assert [(e.kind, e.entry_id) for e in s.outbox.ends] == [("dead", "1")]
    assert s.outbox.acks == [("2", "t-2")]


def test_a_slot_holds_what_was_handed_to_it_up_to_its_own_concurrency():
    """Requests handed out count against their slot before the downloader queues them there
    (Scrapy fills ``slot.active`` a turn later), up to the slot's limit: its DOWNLOAD_SLOTS
    concurrency for a slot the downloader has not made yet, else the per-domain one."""
    s, session, engine = shell()
    engine.downloader.domain_concurrency = 1
    engine.downloader.per_slot_settings = {"slot": {"concurrency": 3}}
    handed = []
    for n in range(5):
        session.hand(f"http://a.test/{n}", str(n))
    while (request := s.next_request()) is not None:
        handed.append(request)
        engine.downloader.active.add(request)  # the engine's fetch, at once
    assert len(handed) == 3
    engine.downloader.active.discard(handed[0])  # one download done
    fourth = s.next_request()
    assert fourth is not None
    engine.downloader.active.add(fourth)
    assert s.next_request() is None


def test_a_request_moved_to_another_slot_no_longer_counts_against_its_first():
    """A downloader middleware may move a request to a slot of its own (``download_slot``,
    e.g. one per proxy): its host's slot has room again."""
    s, session, engine = shell()
    engine.downloader.domain_concurrency = 1
    engine.downloader.get_slot_key = lambda request: request.meta.get("download_slot", "host")
    session.hand("http://a.test/1", "1")
    session.hand("http://a.test/2", "2")
    first = s.next_request()
    assert first is not None
    engine.downloader.active.add(first)
    assert s.next_request() is None  # the host's slot is full
    first.meta["download_slot"] = "proxy-1"  # moved by a middleware
    assert s.next_request() is not None


def test_a_worker_times_the_visits_by_redis_clock_not_its_own():
    """Before, each worker timed a URL's visits by its own clock: a worker whose clock ran
    an hour behind another's counted a visit an hour apart as none (``max(0, ...)``), and
    one an hour ahead counted an hour more, unchanged, and stretched the interval."""
    config = RevisitConfig(rules=(), adaptive=True, minimum=1.0, maximum=86400.0)
    s, session, _ = shell(revisit=config)
    session.remote.server_offset_ms = 3_600_000.0  # Redis's clock an hour ahead of this one
    request = Request("http://a.example/p/1", meta={metakeys.REVISIT: 50})
    assert s.inflight.revisit is not None and s.inflight.revisit(request) is not None
    state = RevisitState.from_meta(request.meta[metakeys.REVISIT_STATE])
    assert state.last == pytest.approx(time.time() + 3600, abs=60)


def _redirect(original: Request, url: str) -> Request:
    """RedirectMiddleware's copy of *original* (its meta, and so its lease, copied)."""
    target = original.replace(url=url)
    urls = [*original.meta.get("redirect_urls", []), original.url]
    target.meta.update(redirect_urls=urls, redirect_times=len(urls), redirect_reasons=[302])
    return target


def test_a_revisited_requests_redirect_is_carried_in_memory_and_ends_its_visit():
    """scheduler/carry.py: not stored, handed out first, counted as pending; the original
    finishes with its target, and ends by the target's verdict (a failed visit here)."""
    s, session, engine = shell(revisit=RevisitConfig(rules=()))
    state = RevisitState(interval=60.0, visits=2).as_meta()
    page = session.hand("http://a.test/old", "1")
    page.meta.update({metakeys.REVISIT: 60, metakeys.REVISIT_STATE: state})
    other = session.hand("http://a.test/other", "2")
    assert s.next_request() is page
    target = _redirect(page, "http://a.test/new")
    assert s.enqueue_request(target)
    assert s.outbox.children == [] and target.meta[metakeys.REVISIT] is False
    assert s.has_pending_requests() and len(s) == 2  # the target and the other lease
    session.renewals.valid_until = time.monotonic() - 1
    assert s.next_request() is None  # not while the page's lease may have expired
    session.renewals.valid_until = math.inf
    s.inflight.collect_finished()
    assert s.outbox.ends == [] and s.outbox.acks == []  # its target not handed out yet
    assert s.next_request() is target and s.next_request() is other
    engine.downloader.active.add(target)
    s.inflight.collect_finished()
    assert s.outbox.ends == [] and s.outbox.acks == [("2", "t-2")]  # the target runs
    target.meta[metakeys.OUTCOME] = Verdict.dead(FailureClass.GONE, "HTTP 404", status=404)
    engine.downloader.active.clear()
    s.inflight.collect_finished()
    (end,) = s.outbox.ends
    assert (end.kind, end.entry_id, end.request) == ("revisit", "1", page)
    assert end.visit is not None and end.visit.found == "failed"
    assert RevisitState.from_meta(page.meta[metakeys.REVISIT_STATE]).failures == 1


def test_a_carried_targets_retry_and_chain_end_its_original():
    s, session, engine = shell(revisit=RevisitConfig(rules=()))
    page = session.hand("http://a.test/old", "1")
    page.meta[metakeys.REVISIT] = 60
    assert s.next_request() is page
    first = _redirect(page, "http://a.test/new")
    assert s.enqueue_request(first) and s.next_request() is first
    second = _redirect(first, "http://a.test/newer")  # a chain: takes the first's place
    assert s.enqueue_request(second) and s.outbox.children == []
    s.inflight.collect_finished()
    assert s.outbox.ends == []  # the second waits
    assert s.next_request() is second
    engine.downloader.active.add(second)
    second.meta[metakeys.OUTCOME] = Verdict.retry(FailureClass.SERVER, "HTTP 503", delay=2)
    second.meta[metakeys.RETRIES] = {"server": 1}
    assert s.enqueue_request(second.replace(priority=-1))  # its retry copy: not queued
    engine.downloader.active.clear()
    s.inflight.collect_finished()
    # the page's lease ends as a retry, its payload the page's URL, its retries counted
    assert s.outbox.ends == [EndOp("retry", "1", "t-1", page, 0.0, -1)]
    assert page.meta[metakeys.RETRIES] == {"server": 1}
    verdict = Verdict.from_meta(page.meta)  # what Ends.end reads the retry's delay from
    assert verdict is not None and verdict.is_retry and verdict.delay == 2


@deferred_f_from_coro_f
async def test_close_drops_a_carried_target_not_handed_out_and_releases_its_page():
    s, session, _ = shell(revisit=RevisitConfig(rules=()))
    page = session.hand("http://a.test/old", "1")
    page.meta[metakeys.REVISIT] = 60
    assert s.next_request() is page
    assert s.enqueue_request(_redirect(page, "http://a.test/new"))
    await maybe_deferred_to_future(s.close("shutdown"))
    assert session.closed is not None
    assert session.closed["acks"] == [] and session.closed["released"] == [("1", "t-1")]
    assert not s.has_pending_requests() and len(s) == 0


def test_a_carried_target_goes_out_at_the_in_flight_cap():
    """Its original holds the cap's place and finishes only with it: held back at the cap
    (HA_MAX_INFLIGHT), every request in flight could wait for its target, for ever."""
    s, session, engine = shell(revisit=RevisitConfig(rules=()), max_inflight=1, max_unacked=2)
    page = session.hand("http://a.test/old", "1")
    page.meta[metakeys.REVISIT] = 60
    session.hand("http://a.test/other", "2")
    assert s.next_request() is page
    target = _redirect(page, "http://a.test/new")
    assert s.enqueue_request(target)
    assert s.next_request() is target  # (before: None, the page at the cap, for ever)
    engine.downloader.active.add(target)
    assert s.next_request() is None  # the cap holds for the rest
    engine.downloader.active.clear()
    assert s.next_request() is not None and s.outbox.ends[0].entry_id == "1"


@pytest.mark.parametrize("target_url", ["http://b.test/new", "ftp://b.test/new"])
def test_a_redirect_to_a_closed_domain_or_another_scheme_is_not_carried(target_url):
    """A carried target goes out at once, past the domain's 429 gate (and the crawl-wide
    limits Redis keeps) and past HA_ALLOWED_SCHEMES: such a redirect goes the way of any
    child instead, stored and leased within them (or refused)."""
    s, session, _ = shell(revisit=RevisitConfig(rules=()))
    s.close_gate(Request("http://b.test/429"), 600)
    page = session.hand("http://a.test/old", "1")
    page.meta[metakeys.REVISIT] = 60
    assert s.next_request() is page
    target = _redirect(page, target_url)
    stored = s.enqueue_request(target)
    assert not s.inflight.carried.waiting and s.next_request() is not target  # (before: carried)
    if target_url.startswith("ftp"):
        assert not stored and s.outbox.children == []  # refused, as a child of that scheme is
    else:
        assert stored and [e.fresh.request for e in s.outbox.children if e.fresh] == [target]


def test_a_new_lease_of_an_entry_is_not_ended_by_the_target_of_its_lost_lease():
    """The page's lease lost while its target waits, and the entry leased to this worker
    again: the target is dropped, and the new lease ends by its own visit. Before, the old
    target went out under the lost lease, and the new lease ended by its 404."""
    s, session, engine = shell(revisit=RevisitConfig(rules=()))
    page = session.hand("http://a.test/old", "1")
    page.meta[metakeys.REVISIT] = 60
    assert s.next_request() is page
    target = _redirect(page, "http://a.test/gone")
    assert s.enqueue_request(target)
    s.drop_lost({("1", "t-1")})
    assert not s.inflight.carried.waiting and s.next_request() is None
    again = Request("http://a.test/old", meta={metakeys.REVISIT: 60})
    s.take(again, Lease("1", "t-1b", b"", 1))
    assert s.next_request() is again
    target.meta[metakeys.OUTCOME] = Verdict.dead(FailureClass.GONE, "HTTP 404", status=404)
    s.inflight.collect_finished()
    ends = [(e.kind, e.token, e.visit.found if e.visit else None) for e in s.outbox.ends]
    assert ends == [("revisit", "t-1b", ends[0][2])] and ends[0][2] != "failed", ends
