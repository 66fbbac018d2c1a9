"""A checkpoint's field that cannot be stored, or a checkpoint over its size, is warned of
once per task in a crawl, and counted every time: a spider that wrote a set in its fields
at every page had the same WARNING at every page (a QA run)."""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from scrapy import Spider
from scrapy.utils.test import get_crawler

from scrapy_ha.middlewares.storable import checkpoint_payload, drop_unstorable

if TYPE_CHECKING:
    from collections.abc import Iterator


def test_an_unstorable_field_and_an_oversized_checkpoint_are_said_once_per_task(caplog):
    crawler = get_crawler(Spider)
    stats = crawler.stats
    assert stats is not None
    big = {"task": "t", "last_id": "x" * 4096, "fields": {"notes": "x"}}  # even without
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            drop_unstorable("t", {"seen": {1, 2}}, stats)
            assert checkpoint_payload("t", big, max_bytes=1024, stats=stats) is None
        drop_unstorable("u", {"seen": {1, 2}}, stats)  # another task: said for it
    said = [r.getMessage() for r in caplog.records]
    assert len([m for m in said if "Field 'seen' of the checkpoint of task t " in m]) == 1
    assert len([m for m in said if "Checkpoint of task t not saved" in m]) == 1
    assert len([m for m in said if "task u " in m]) == 1
    assert stats.get_value("ha/checkpoint/fields_dropped") == 4
    assert stats.get_value("ha/checkpoint/too_large") == 3


def test_a_checkpoint_saved_without_its_fields_then_one_not_saved_are_each_said():
    """The two share no warning: once a task's checkpoint was saved without its fields, a
    later one not saved at all (its task then never done) was silent."""
    crawler = get_crawler(Spider)
    stats = crawler.stats
    assert stats is not None
    slim = {"task": "t", "fields": {"notes": "x" * 2000}}
    big = {"task": "t", "last_id": "x" * 2000, "fields": {"notes": "x"}}
    with caplog_records() as said:
        assert b'"fields_dropped":true' in checkpoint_payload(
            "t", slim, max_bytes=1024, stats=stats
        )
        assert checkpoint_payload("t", big, max_bytes=1024, stats=stats) is None
    assert [m for m in said if "saved without the spider's fields" in m]
    assert [m for m in said if "not saved" in m and "HA_CHECKPOINT_MAX_BYTES=1024" in m]
    assert stats.get_value("ha/checkpoint/fields_dropped") == 1
    assert stats.get_value("ha/checkpoint/too_large") == 1


def test_a_next_page_of_more_than_a_megabyte_is_not_saved():
    """The next page's request is not counted in HA_CHECKPOINT_MAX_BYTES; a request of more
    than 1 MB (Redis decodes it at each save, about 12 ms a MB) is not saved."""
    crawler = get_crawler(Spider)
    stats = crawler.stats
    assert stats is not None
    fits = {"task": "t", "next": "x" * (512 * 1024)}
    assert checkpoint_payload("t", fits, max_bytes=1024, stats=stats) is not None
    with caplog_records() as said:
        over = {"task": "t", "next": "x" * (1 << 20)}
        assert checkpoint_payload("t", over, max_bytes=1024, stats=stats) is None
    assert [m for m in said if "its next page's request is" in m], said
    assert stats.get_value("ha/checkpoint/too_large") == 1


@contextlib.contextmanager
def caplog_records() -> Iterator[list[str]]:
    """The messages the checkpoint's module logs in the block."""
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    log = logging.getLogger("scrapy_ha.middlewares.storable")
    log.addHandler(handler)
    try:
        yield said
    finally:
        log.removeHandler(handler)
