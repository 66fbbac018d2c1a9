"""The fair buffer's heap (scheduler.buffer.FairHeap): the head comes from the least busy
download slot, and a slot's load is asked only when there are slots to compare."""

from __future__ import annotations

from scrapy import Request

from scrapy_ha.scheduler.buffer import FairHeap


class Chooser:
    """Slots by host; the loads given, each question recorded."""

    def __init__(self, loads: dict[str, int]) -> None:
        self.loads = loads
        self.asked: list[str] = []

    def key(self, request: Request) -> str:
        return request.url.split("/")[2]

    def load(self, key: str) -> int:
        self.asked.append(key)
        return self.loads[key]


def _heap(chooser: Chooser, urls: list[str]) -> FairHeap:
    heap: FairHeap = FairHeap(chooser, lambda entry: entry[-1])
    for i, url in enumerate(urls):
        heap.push((0, i, Request(url)))
    return heap


def test_one_slot_is_the_head_without_asking_its_load():
    chooser = Chooser({"a.test": 5})
    heap = _heap(chooser, ["http://a.test/1", "http://a.test/2"])
    assert heap.head_slot() == "a.test"
    assert heap.slots() == ["a.test"]
    assert heap.pop()[-1].url == "http://a.test/1"
    assert chooser.asked == []


def test_of_several_slots_the_least_busy_is_the_head():
    chooser = Chooser({"a.test": 5, "b.test": 1})
    heap = _heap(chooser, ["http://a.test/1", "http://b.test/1"])
    assert heap.head_slot() == "b.test"
    assert heap.slots() == ["b.test", "a.test"]
    assert heap.pop()[-1].url == "http://b.test/1"
    assert heap.head_slot() == "a.test"


def test_an_empty_heap_has_no_head():
    heap = _heap(Chooser({}), [])
    assert heap.head_slot() is None and heap.slots() == [] and heap.peek() is None
