"""A checkpoint's field that cannot be stored, or a checkpoint over its size, is warned of
once per task in a crawl, and counted every time: a spider that wrote a set in its fields
at every page had the same WARNING at every page (a QA run)."""

from __future__ import annotations

import logging

from scrapy import Spider
from scrapy.utils.test import get_crawler

from scrapy_ha.middlewares.storable import checkpoint_payload, drop_unstorable


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
    assert len([m for m in said if "Checkpoint of task t is" in m]) == 1
    assert len([m for m in said if "task u " in m]) == 1
    assert stats.get_value("ha/checkpoint/fields_dropped") == 4
    assert stats.get_value("ha/checkpoint/too_large") == 3
