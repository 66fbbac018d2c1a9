"""What a download slot holds (scheduler.engine.slots.SlotLoad): a request this worker handed out
counts against its slot while it is on its way there, and once in the slot through the
slot's own ``active`` set, never twice and never after it left the slot."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import scrapy.core.downloader
from scrapy import Request
from scrapy.core.downloader import Downloader
from scrapy.utils.httpobj import urlparse_cached

from scrapy_ha.scheduler.engine.slots import SlotLoad
from tests.test_scheduler_shell import FakeEngine

if TYPE_CHECKING:
    import pytest

#: The slot's concurrency in these tests: enough requests to fill it.
LIMIT = 4


def _load() -> tuple[SlotLoad, SimpleNamespace, FakeEngine, list[Request]]:
    """A SlotLoad over a downloader whose slot "s" exists, with the slot keys it is asked
    for recorded (the dear part of a check: a URL parsed per request)."""
    engine = FakeEngine()
    asked: list[Request] = []

    def slot_key(request: Request) -> str:
        asked.append(request)
        return "s"

    engine.downloader.get_slot_key = slot_key
    engine.downloader.slots["s"] = SimpleNamespace(concurrency=LIMIT, active=set())
    return SlotLoad(), SimpleNamespace(engine=engine), engine, asked


def _hand(load: SlotLoad, crawler: SimpleNamespace, engine: FakeEngine, n: int) -> list[Request]:
    requests = [Request(f"http://a.test/{i}") for i in range(n)]
    for request in requests:
        load.handed(crawler, request)
        engine.downloader.active.add(request)  # the engine's fetch, at once
    return requests


def test_a_request_that_reached_its_slot_is_counted_there_once():
    load, crawler, engine, _ = _load()
    requests = _hand(load, crawler, engine, LIMIT - 1)
    slot = engine.downloader.slots["s"]
    assert load.free(crawler, Request("http://a.test/new"))
    slot.active.update(requests)  # the downloader middlewares ran: in the slot
    assert load.load(crawler, "s") == LIMIT - 1
    assert load.free(crawler, Request("http://a.test/new"))


def test_a_request_that_left_its_slot_holds_no_place_of_it_any_more():
    # its response goes back through the downloader middlewares after the slot let it go
    # and before the downloader does: the slot may start another meanwhile
    load, crawler, engine, _ = _load()
    requests = _hand(load, crawler, engine, LIMIT)
    slot = engine.downloader.slots["s"]
    slot.active.update(requests)
    assert not load.free(crawler, Request("http://a.test/new"))
    slot.active.discard(requests[0])  # still in downloader.active
    assert load.free(crawler, Request("http://a.test/new"))
    assert load.load(crawler, "s") == LIMIT - 1


def test_the_slot_key_is_asked_only_of_requests_still_on_their_way():
    load, crawler, engine, asked = _load()
    requests = _hand(load, crawler, engine, LIMIT - 1)
    engine.downloader.slots["s"].active.update(requests[1:])  # one still on its way
    asked.clear()
    new = Request("http://a.test/new")
    for _ in range(3):  # as the engine asks, once per request it may start
        assert load.free(crawler, new)
    # those in the slot are forgotten at the first check: 2 in it and 1 on its way do not
    # fill it, so nobody's slot key is asked
    assert [r for r in asked if r is not new] == []


def test_the_requests_handed_out_are_looked_through_only_when_the_slot_may_be_full():
    # a free() per hand-out rebuilt the list of those on their way (ten a page at loopback)
    load, crawler, engine, asked = _load()
    requests = _hand(load, crawler, engine, LIMIT - 1)
    asked.clear()
    new = Request("http://a.test/new")
    assert load.free(crawler, new)  # 0 in the slot and 3 on their way: not full, however keyed
    assert [r for r in asked if r is not new] == []
    slot = engine.downloader.slots["s"]
    slot.active.update(requests[:2])  # the first two reached it: forgotten
    assert load.free(crawler, new)
    assert load._handed["s"] == [requests[2]]
    (last,) = _hand(load, crawler, engine, 1)
    slot.active.add(last)  # reached it before requests[2] did
    slot.active.add(Request("http://a.test/other"))  # another worker's, say: 4 in the slot
    asked.clear()
    assert not load.free(crawler, new)  # 4 in the slot: full, requests[2] still on its way
    assert [r for r in asked if r is not new] == [requests[2]]
    assert load._handed["s"] == [requests[2]]


def test_a_request_that_reached_its_slot_out_of_order_is_not_counted_again_once_it_left():
    # A waits in a downloader middleware while R overtakes it into the slot; R's response
    # then goes back through the middlewares (out of the slot, still in downloader.active)
    load, crawler, engine, _ = _load()
    a, r = _hand(load, crawler, engine, 2)
    slot = engine.downloader.slots["s"]
    slot.active.add(r)
    new = Request("http://a.test/new")
    assert load.free(crawler, new)  # 1 in the slot, A on its way
    slot.active.discard(r)
    slot.active.update({Request("http://a.test/o1"), Request("http://a.test/o2")})
    assert load.free(crawler, new)  # 2 in the slot and A on its way: 3 of 4
    assert load.load(crawler, "s") == 3


def _scrapy_downloader(monkeypatch: pytest.MonkeyPatch, **attrs: Any) -> tuple[Any, list[Any]]:
    """Scrapy's own Downloader (its get_slot_key), its state set by hand, and the requests
    whose URL it looks up (``urlparse_cached``, what its get_slot_key parses)."""
    parsed: list[Any] = []

    def counted(request: Any) -> Any:
        parsed.append(request)
        return urlparse_cached(request)

    monkeypatch.setattr(scrapy.core.downloader, "urlparse_cached", counted)
    downloader = Downloader.__new__(Downloader)
    state = {"active": set(), "slots": {}, "per_slot_settings": {}, "ip_concurrency": 0}
    for name, value in {**state, "domain_concurrency": LIMIT, **attrs}.items():
        setattr(downloader, name, value)
    return downloader, parsed


def _on_their_way(load: SlotLoad, crawler: SimpleNamespace, n: int) -> list[Request]:
    requests = [Request(f"http://a.test/{i}") for i in range(n)]
    for request in requests:
        load.handed(crawler, request)
        crawler.engine.downloader.active.add(request)  # fetched, not in its slot yet
    return requests


def test_scrapys_downloader_is_not_asked_again_for_the_slots_of_requests_on_their_way(
    monkeypatch: pytest.MonkeyPatch,
):
    downloader, parsed = _scrapy_downloader(monkeypatch)
    crawler, load = SimpleNamespace(engine=SimpleNamespace(downloader=downloader)), SlotLoad()
    _on_their_way(load, crawler, LIMIT - 1)
    parsed.clear()
    new = Request("http://a.test/new")
    assert load.free(crawler, new)
    assert load.load(crawler, "a.test") == LIMIT - 1
    assert [r for r in parsed if r is not new] == []  # the slot key of the new one only


def test_a_request_a_middleware_moved_leaves_its_first_slot_with_scrapys_downloader(
    monkeypatch: pytest.MonkeyPatch,
):
    downloader, _ = _scrapy_downloader(monkeypatch)
    crawler, load = SimpleNamespace(engine=SimpleNamespace(downloader=downloader)), SlotLoad()
    requests = _on_their_way(load, crawler, LIMIT)
    assert not load.free(crawler, Request("http://a.test/new"))
    requests[0].meta["download_slot"] = "proxy-1"  # one slot per proxy
    assert load.free(crawler, Request("http://a.test/new"))


def test_with_per_ip_slots_scrapys_downloader_is_asked(monkeypatch: pytest.MonkeyPatch):
    # the host's slot becomes its address's once resolved: only the downloader knows
    downloader, parsed = _scrapy_downloader(monkeypatch, ip_concurrency=LIMIT)
    crawler, load = SimpleNamespace(engine=SimpleNamespace(downloader=downloader)), SlotLoad()
    requests = _on_their_way(load, crawler, LIMIT)  # the slot may be full: looked through
    parsed.clear()
    assert not load.free(crawler, Request("http://a.test/new"))
    assert set(requests) <= set(parsed)


def test_a_request_handed_out_right_after_its_check_has_its_slot_key_asked_once():
    load, crawler, engine, asked = _load()
    request = Request("http://a.test/1")
    assert load.free(crawler, request)
    load.handed(crawler, request)  # the same call of the engine: the key just asked
    assert asked == [request]
    other = Request("http://a.test/2")
    assert load.free(crawler, other)
    load.handed(crawler, request)  # not the one just checked: asked again
    assert asked == [request, other, request]
    load.handed(crawler, other)  # a check serves one hand-out only
    assert asked == [request, other, request, other]
    # the last handed out counts until the engine's next call (it has it then: here, none
    # reached the downloader)
    assert load.load(crawler, "s") == 1
    load.taken()
    assert load.load(crawler, "s") == 0


def test_a_request_handed_out_counts_before_the_engine_has_it():
    """The engine adds a request to ``downloader.active`` once ``next_request()`` returned
    it; a count made within that call (the scheduler weighs the slots as it hands out)
    forgot it, and a host's slot looked empty at each hand-out (a QA run: 17 requests of
    one host in a millisecond, two allowed at once)."""
    load, crawler, engine, asked = _load()
    first = Request("http://a.test/1")
    assert load.free(crawler, first)
    load.handed(crawler, first)
    assert load.load(crawler, "s") == 1  # (before: 0, not in downloader.active yet)
