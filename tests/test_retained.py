"""What a worker keeps of the children Redis confirmed, for a failover that loses them
(scrapy_ha.scheduler.outbox.Retained): kept while their page is held, roots for a while and while
crawled, and what is stored again when a server lacks them."""

from __future__ import annotations

import gc
import weakref

import scrapy

from scrapy_ha.scheduler import outbox as _outbox
from scrapy_ha.scheduler.outbox import Retained
from scrapy_ha.store.wire import Fresh, NewEntry

PAGE = ("7", "tok-7")


def _entry(n: int, parent=PAGE, fresh: Fresh | None = None) -> NewEntry:
    return NewEntry(b"fp%d" % n, 0, b"{}", parent=parent, fresh=fresh)


def _kept(retained: Retained) -> list[int]:
    return [e[0] for e in retained.entries]


def test_children_are_kept_until_their_page_is_no_longer_held(monkeypatch):
    retained = Retained()
    retained.keep(1, [_entry(1), _entry(2, parent=("8", "tok-8"))])
    assert retained.newest() == 2
    retained.prune(lambda: [PAGE, ("8", "tok-8")])
    assert _kept(retained) == [1, 2]
    monkeypatch.setattr(_outbox, "PRUNE_INTERVAL", 0.0)
    retained.prune(lambda: [PAGE])  # page 8's end was confirmed
    assert _kept(retained) == [1]
    retained.prune(list)
    assert _kept(retained) == [] and retained.newest() == 0


def test_a_root_is_kept_for_a_while_and_while_it_is_crawled(monkeypatch):
    monkeypatch.setattr(_outbox, "PRUNE_INTERVAL", 0.0)
    crawled = Fresh(scrapy.Request("http://x/a"), lease=("f1", "t1"), sealed=True)
    retained = Retained()
    retained.keep(1, [_entry(1, parent=None), _entry(2, parent=None, fresh=crawled)])
    retained.prune(lambda: [("f1", "t1")])
    assert _kept(retained) == [1, 2]  # younger than ROOT_RETENTION (1 is not crawled)
    monkeypatch.setattr(_outbox, "ROOT_RETENTION", 0.0)
    retained.prune(lambda: [("f1", "t1")])
    assert _kept(retained) == [2]  # old, but this worker still crawls it
    retained.prune(list)
    assert _kept(retained) == []


def test_a_crawled_and_ended_child_is_kept_without_its_request_object(monkeypatch):
    # A root is kept ROOT_RETENTION seconds after Redis stored it, a child while its page is
    # held: at hundreds of pages a second that is thousands of requests, which the worker
    # must not keep alive once their leases ended (each is a dozen objects more for every
    # pass of the garbage collector). The numbers and what is stored again stay.
    monkeypatch.setattr(_outbox, "PRUNE_INTERVAL", 0.0)
    root = scrapy.Request("http://x/root")
    child = scrapy.Request("http://x/child")
    refs = [weakref.ref(root), weakref.ref(child)]
    retained = Retained()
    retained.keep(
        1,
        [
            _entry(1, parent=None, fresh=Fresh(root, lease=("r1", "tr"), sealed=True)),
            _entry(2, fresh=Fresh(child, lease=("c1", "tc"), sealed=True)),
        ],
    )
    retained.prune(lambda: [PAGE, ("r1", "tr"), ("c1", "tc")])
    assert [e.taken for e in retained.children()] == [("r1", "tr"), ("c1", "tc")]
    retained.prune(lambda: [PAGE])  # both crawled, their acks confirmed
    del root, child
    gc.collect()
    assert _kept(retained) == [1, 2]  # a failover could still lose them
    assert [r() for r in refs] == [None, None]
    numbers, children = retained.lost(0, [PAGE])
    assert numbers == [1, 2] and [c.taken for c in children] == [None, None]


def test_kept_children_without_their_request_objects_are_not_tracked_by_the_collector(
    monkeypatch,
):
    # Thousands of children are kept at a time (roots for ROOT_RETENTION): as objects, each
    # pass of the garbage collector walked them again; as plain tuples of plain values the
    # collector stops tracking them at its first pass.
    monkeypatch.setattr(_outbox, "PRUNE_INTERVAL", 0.0)
    handed = Fresh(scrapy.Request("http://x/h"), lease=("h1", "th"), sealed=True)
    retained = Retained()
    retained.keep(1, [_entry(1), _entry(2, parent=None, fresh=handed)])
    retained.prune(lambda: [PAGE])  # 2 was crawled and ended
    gc.collect()  # untracks the tuples (a child's fields: the lease first)
    gc.collect()  # in a crawl, by the next pass
    assert [gc.is_tracked(kept) for kept in retained.entries] == [False, False]
    assert [c.fingerprint for c in retained.children()] == [b"fp1", b"fp2"]


def test_a_request_handed_out_is_not_kept_alive_by_its_round():
    # Stored by its round, a request this worker handed out (or kept) is kept as its lease:
    # its request object lives as long as the engine holds it, not until the next pruning
    # (at most PRUNE_INTERVAL later, when a crawl hands out hundreds of requests a second).
    handed = scrapy.Request("http://x/h")
    kept = scrapy.Request("http://x/k")
    refs = [weakref.ref(handed), weakref.ref(kept)]
    retained = Retained()
    retained.keep(
        1,
        [
            _entry(1, fresh=Fresh(handed, lease=("h1", "th"), sealed=True)),
            _entry(2, fresh=Fresh(kept, lease=("k1", "tk"), sealed=True, kept=True)),
        ],
    )
    del handed, kept
    gc.collect()
    assert [r() for r in refs] == [None, None]
    assert [(c.taken, c.kept) for c in retained.children()] == [
        (("h1", "th"), False),
        (("k1", "tk"), True),
    ]
    numbers, children = retained.lost(0, [PAGE, ("h1", "th"), ("k1", "tk")])
    assert numbers == [1, 2] and [(c.taken, c.kept) for c in children] == [
        (("h1", "th"), False),
        (("k1", "tk"), True),
    ]


def test_what_is_stored_again_keeps_its_number_and_a_finished_one_goes_pending():
    handed = Fresh(scrapy.Request("http://x/h"), lease=("h1", "th"), sealed=True)
    done = Fresh(scrapy.Request("http://x/d"), lease=("d1", "td"), sealed=True)
    sent = Fresh(scrapy.Request("http://x/s"), sealed=True)  # sealed, never handed out
    retained = Retained()
    retained.keep(4, [_entry(4), _entry(5, fresh=handed), _entry(6, fresh=done)])
    retained.keep(7, [_entry(7, fresh=sent)])
    assert retained.children()[-1].fresh is None  # kept without its request object
    numbers, children = retained.lost(4, [PAGE, ("h1", "th")])
    assert numbers == [5, 6, 7]
    assert [c.taken for c in children] == [("h1", "th"), None, None]


def test_a_sharded_crawl_keeps_nothing():
    retained = Retained(enabled=False)
    retained.keep(1, [_entry(1)])
    assert retained.entries == [] and retained.newest() == 0


def test_roots_crawled_past_their_time_keep_the_number_order(monkeypatch):
    # A pass looks only at the roots whose time is up; one this worker still crawls is kept
    # apart from the younger ones, and what is stored again still comes in number order.
    monkeypatch.setattr(_outbox, "PRUNE_INTERVAL", 0.0)
    now = [0.0]
    retained = Retained(clock=lambda: now[0])
    crawled = Fresh(scrapy.Request("http://x/a"), lease=("f1", "t1"), sealed=True)
    retained.keep(1, [_entry(1, parent=None, fresh=crawled), _entry(2, parent=None)])
    now[0] = 5.0
    retained.keep(3, [_entry(3, parent=None), _entry(4)])
    now[0] = _outbox.ROOT_RETENTION + 1.0  # 1 and 2 are old, 3 is not
    retained.prune(lambda: [PAGE, ("f1", "t1")])
    assert _kept(retained) == [1, 3, 4] and retained.newest() == 4
    numbers, children = retained.lost(0, [("f1", "t1")])
    assert numbers == [1, 3, 4] and [c.taken for c in children] == [("f1", "t1"), None, None]
    now[0] = 100.0
    retained.prune(lambda: [PAGE])  # 1 ended, 3 is old now
    assert _kept(retained) == [4] and retained.newest() == 4
    retained.prune(list)
    assert _kept(retained) == [] and retained.newest() == 0
