"""The item outbox (``HA_ITEMS``) and the defaults of the item stream's consumers.

With ``HA_ITEMS = "outbox"`` a worker holds the items a page yielded, once they went through
its item pipelines, and commits them to the crawl's item stream in the script call that acks
the page (:mod:`scrapy_ha.scheduler.items`); sinks outside the workers read the stream
(:mod:`scrapy_ha.sinks`, ``scrapy-ha items``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy_ha.config import validate as check
from scrapy_ha.config.validate import ConfigError

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_BLOCK",
    "DEFAULT_CLAIM_IDLE",
    "DEFAULT_ITEMS",
    "ITEMS_MODES",
    "OUTBOX",
    "consumer_pipelines",
    "items_mode",
]

#: The modes of ``HA_ITEMS``: ``"off"``, items go through the pipelines as in Scrapy, and a
#: page redone after its worker died emits its items again; ``"outbox"``, a page's items are
#: committed with its ack, exactly once.
OUTBOX = "outbox"
ITEMS_MODES = ("off", OUTBOX)
#: Off unless asked: the outbox changes where items end up (the stream, read by a sink
#: outside the workers), which a project must choose knowingly.
DEFAULT_ITEMS = "off"
#: Entries a consumer reads per call, and commits to its sink in one go (one SQL
#: transaction, one fsync of a JSON Lines file): big enough that the commit's fixed cost is
#: spread thin, small enough that a sink killed mid-batch redoes a fraction of a second.
DEFAULT_BATCH = 100
#: Seconds an entry waits in the hands of a consumer that stopped acknowledging (killed,
#: stuck) before another consumer of its group takes it over: far longer than a batch
#: takes, short enough that a dead consumer's batch is not stuck for long.
DEFAULT_CLAIM_IDLE = 60.0
#: Seconds a consumer waits in Redis for new entries before it looks around (its stop
#: signal, entries other consumers left): waiting costs Redis nothing.
DEFAULT_BLOCK = 1.0


def items_mode(settings: BaseSettings) -> str:
    """``HA_ITEMS``: ``"off"`` (None and ``False`` too) or ``"outbox"``."""
    value = settings.get("HA_ITEMS")
    if value in (None, False, ""):
        return DEFAULT_ITEMS
    return check.choice(settings, "HA_ITEMS", DEFAULT_ITEMS, ITEMS_MODES)


def consumer_pipelines(settings: BaseSettings) -> dict[str, Any]:
    """The item pipelines a consumer of the stream runs (``scrapy-ha items --to
    pipelines``): ``HA_ITEMS_PIPELINES`` when set, else the project's ``ITEM_PIPELINES``
    (those that clean and validate are best left to the workers, before the outbox, and
    those that store to the consumer: list the latter in ``HA_ITEMS_PIPELINES``)."""
    value = settings.get("HA_ITEMS_PIPELINES")
    if value is None:
        return dict(settings.getwithbase("ITEM_PIPELINES"))
    try:
        return dict(settings.getdict("HA_ITEMS_PIPELINES"))
    except (ValueError, TypeError):
        raise ConfigError(
            f"HA_ITEMS_PIPELINES={value!r} must be a dict of pipeline paths and orders, as "
            f"ITEM_PIPELINES"
        ) from None
