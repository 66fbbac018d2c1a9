"""A worker without the item outbox in a crawl whose item stream has sinks says so at start.

With ``HA_ITEMS`` off a worker's items go to its own item pipelines alone: in a crawl whose
other workers commit theirs to the stream, its share of the items reaches none of the sinks
(consumer groups) that read it, and nothing else would say why they hold fewer."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import redis

from scrapy_ha.config.items import OUTBOX
from scrapy_ha.store.items import crawl_items

if TYPE_CHECKING:
    from scrapy_ha.store.queue import RedisQueue

__all__ = ["say_unfed_sinks"]

logger = logging.getLogger(__name__)


async def say_unfed_sinks(queue: RedisQueue, mode: str) -> None:
    """A WARNING at start from a worker without the outbox (*mode*, ``HA_ITEMS``) in a crawl
    whose item stream has sinks (consumer groups, declared or consuming), naming them; a
    user the ACL refuses ``XINFO`` (not among the worker's scripts' commands) is not told."""
    if mode == OUTBOX:
        return
    try:
        groups = [g.name for g in (await crawl_items(queue)).groups]
    except redis.ResponseError as exc:  # an ACL user narrowed to the worker's own commands
        logger.debug("Could not read the sinks of the item stream: %s", exc)
        return
    if groups:
        logger.warning(
            "HA_ITEMS is %r in this worker, but the crawl's item stream has %d sink(s) (%s): "
            "the items this worker scrapes reach none of them, only its own item pipelines. "
            'Set HA_ITEMS = "outbox" in every worker of the crawl (scrapyd: -d '
            "setting=HA_ITEMS=outbox), or take a sink declared by mistake away (`scrapy-ha "
            "items %s --to SINK --undeclare`)",
            mode,
            len(groups),
            ", ".join(groups),
            queue.keys.spider,
        )
