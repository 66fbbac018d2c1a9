"""``HA_CHECKPOINT_ITEMS`` with the item outbox is named at start: with ``HA_ITEMS =
"outbox"`` no mid-page checkpoint is saved (no item is out before its page's ack), so the
setting does nothing. A QA run: ``-s HA_CHECKPOINT_ITEMS=10`` with the outbox was accepted
silently."""

from __future__ import annotations

from tests.test_proxy_mode_unset import start_warnings

WARNED = (
    "HA_CHECKPOINT_ITEMS does nothing with HA_ITEMS = 'outbox': a page's checkpoint is saved "
    "with its ack, which commits its items, and no mid-page checkpoint is saved"
)


def test_checkpoint_items_with_the_outbox_is_named_at_start(caplog):
    middleware = {"scrapy_ha.checkpoint.CheckpointMiddleware": 900}
    checkpoints = {"HA_CHECKPOINTS": True, "SPIDER_MIDDLEWARES": middleware}
    on = {**checkpoints, "HA_ITEMS": "outbox"}
    assert start_warnings(caplog, {**on, "HA_CHECKPOINT_ITEMS": 10}) == [WARNED]
    assert start_warnings(caplog, on) == []  # the default is not the project's choice
    assert start_warnings(caplog, {**checkpoints, "HA_CHECKPOINT_ITEMS": 10}) == []
    assert start_warnings(caplog, {**on, "HA_ITEMS": "off", "HA_CHECKPOINT_ITEMS": 10}) == []
