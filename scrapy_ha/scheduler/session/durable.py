"""Up to when Redis has the crawl on disk, for the start requests a worker keeps.

A worker keeps each start request it stored (a root: no page yielded it) for
:data:`~scrapy_ha.scheduler.outbox.ROOT_RETENTION`, to store it again on a server that lost
it (a failover to a replica behind, an AOF that lost its last second). A Redis that keeps
RDB snapshots alone (``appendonly no`` with ``save``, Redis's default) loses far more on a
crash: everything since its last snapshot, minutes of it. A root stored since is gone then,
and with it every page only it leads to: a QA run whose Redis crashed 45 s into a crawl,
before its first snapshot, ended ``finished`` with 4,282 of 6,600 pages never crawled. So
on such a server, a root is kept until a snapshot that began after it was stored has
completed (``INFO persistence``), or for :data:`~scrapy_ha.scheduler.outbox.ROOT_MAX_AGE`
at most; AOF on, no ``save``, a cluster, or ``CONFIG``/``INFO`` refused: as before.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from typing import TYPE_CHECKING, Any

import redis

from scrapy_ha.store.health import is_cluster
from scrapy_ha.store.wire import text

if TYPE_CHECKING:
    from scrapy_ha.scheduler.outbox import Retained

__all__ = ["Durability", "stored_again"]

logger = logging.getLogger(__name__)

#: Seconds between two looks at Redis's persistence, while roots wait for a snapshot.
LOOK_INTERVAL = 1.0
#: Seconds taken off a snapshot's start: its times are whole seconds.
MARGIN = 1.0


class Durability:
    """Sets :attr:`Retained.on_disk` from the server's last RDB snapshot (see the module)."""

    def __init__(self, retained: Retained) -> None:
        #: whether the server keeps RDB snapshots alone (None: not asked yet)
        self.rdb_only: bool | None = None
        self._looked = -math.inf
        # not known before the first look: a root past its retention waits for it (a
        # round prunes before it looks; taken for on disk, every root went at once)
        retained.on_disk = -math.inf

    async def look(self, client: Any, retained: Retained) -> None:
        """Ask Redis, at most every :data:`LOOK_INTERVAL`, while *retained* has roots past
        their retention; a Redis that does not answer leaves things as they were (before
        the first answer: those roots kept), one that refuses is taken for AOF on."""
        now = retained.clock()
        if not retained.overdue(now) or now - self._looked < LOOK_INTERVAL:
            return
        self._looked = now
        try:
            if self.rdb_only is None:
                self.rdb_only = await _rdb_only(client)
            if not self.rdb_only:
                retained.on_disk = math.inf
                return
            info = await client.info("persistence")
            seconds, micros = await client.time()
        except redis.exceptions.ResponseError as exc:  # refused (an ACL): as with AOF
            logger.debug("Redis refused to tell its persistence: %s", exc)
            retained.on_disk = math.inf
            return
        except (redis.exceptions.RedisError, OSError) as exc:
            logger.debug("Could not read Redis's persistence: %s", exc)
            return
        retained.on_disk = on_disk(info, seconds + micros / 1e6, now)


def stored_again(retained: Retained, have: int) -> None:
    """The roots numbered past *have*, stored again on a server that lacked them, are kept
    as if stored now: that server counts its start as a snapshot (or has its own), which
    does not hold them."""
    now, kept = retained.clock(), [*retained.roots, *retained.crawled_roots]
    again = sorted((e for e in kept if e[0] > have), key=lambda e: e[0])
    older = [e for e in retained.roots if e[0] <= have]
    retained.roots = deque([*older, *((e[0], now, *e[2:]) for e in again)])
    retained.crawled_roots = [e for e in retained.crawled_roots if e[0] <= have]


def on_disk(info: dict[str, Any], server_now: float, now: float) -> float:
    """The time on the worker's clock (*now* is the server's *server_now*) before which
    every write is in the server's last completed snapshot (inf: AOF on)."""
    if int(info.get("aof_enabled", 0) or 0):
        return math.inf
    took = max(0, int(info.get("rdb_last_bgsave_time_sec", 0) or 0))
    began = int(info.get("rdb_last_save_time", 0) or 0) - took - MARGIN
    return now - (server_now - began)


async def _rdb_only(client: Any) -> bool:
    """AOF off and ``save`` set; False where that cannot be read (a cluster, CONFIG
    refused: a managed service persists by its own configuration)."""
    if is_cluster(client):
        return False
    try:
        aof = await client.config_get("appendonly")
        save = await client.config_get("save")
    except redis.exceptions.ResponseError:
        return False
    return text(aof.get("appendonly", "")) == "no" and bool(text(save.get("save", "")).strip())
