"""``HA_CHECKPOINT_ITEMS`` with the item outbox is named at start: with ``HA_ITEMS =
"outbox"`` no mid-page checkpoint is saved (no item is out before its page's ack), so the
setting does nothing. A QA run: ``-s HA_CHECKPOINT_ITEMS=10`` with the outbox was accepted
silently."""

from __future__ import annotations

import logging

from scrapy import Spider
from scrapy.utils.test import get_crawler

from scrapy_ha.scheduler.shell import Scheduler

WARNED = (
    "HA_CHECKPOINT_ITEMS does nothing with HA_ITEMS = 'outbox': a page's checkpoint is saved "
    "with its ack, which commits its items, and no mid-page checkpoint is saved"
)


def _warnings(caplog, settings):
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        Scheduler.from_crawler(get_crawler(Spider, settings))
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_checkpoint_items_with_the_outbox_is_named_at_start(caplog):
    middleware = {"scrapy_ha.checkpoint.CheckpointMiddleware": 900}
    checkpoints = {"HA_CHECKPOINTS": True, "SPIDER_MIDDLEWARES": middleware}
    on = {**checkpoints, "HA_ITEMS": "outbox"}
    assert _warnings(caplog, {**on, "HA_CHECKPOINT_ITEMS": 10}) == [WARNED]
    assert _warnings(caplog, on) == []  # the default is not the project's choice
    assert _warnings(caplog, {**checkpoints, "HA_CHECKPOINT_ITEMS": 10}) == []
    assert _warnings(caplog, {**on, "HA_ITEMS": "off", "HA_CHECKPOINT_ITEMS": 10}) == []
