"""The runs of a crawl (``lua/run.lua``): which run a worker joins, and when one ends.

A run is the life of a crawl from a start on an empty crawl to the moment a worker sees it
finished. The ``dont_filter`` start requests of a crawl are seeded once per run, however
many workers start it; a crawl kept in Redis (``SCHEDULER_PERSIST = True``) and started
again begins the next run: its start requests are crawled again and everything seen before
stays seen, so the run crawls what is new (Scrapy's ``JOBDIR`` idiom, scrapy-redis's
persist).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_ha.store import scripts
from scrapy_ha.store.sharding import shards_of

if TYPE_CHECKING:
    from scrapy_ha.keys import Keys
    from scrapy_ha.store.queue import RedisQueue

__all__ = ["Run", "RunState", "end_run", "open_run", "read_run", "stopped_at"]

#: The stats' buckets: a minute each (scrapy_ha.ops.stats).
_MINUTE_MS = 60_000


@dataclass(frozen=True)
class Run:
    """The run a worker joined: its number (1, 2, ...), and whether this worker started it."""

    number: int
    started: bool


@dataclass(frozen=True)
class RunState:
    """The crawl's newest run as Redis holds it: its number, whether it is in progress, and
    when it began and ended (server ms; None where not recorded or not a time)."""

    number: int
    open: bool
    started: int | None
    ended: int | None
    #: the crawl's acks when the run began (None: not recorded, a run begun before it was)
    acked_before: int | None = None

    @property
    def pace_from(self) -> int | None:
        """Where the run's pace and ETA count from: its start; for a run that recorded no
        acks when it began (opened by a worker of an earlier version, in a rolling upgrade)
        in the minute the run before ended (``ended``, kept while the run is open), the next
        minute: that minute's bucket holds the run before's acks too (a QA run read 132
        pages/s for 16), so no pace until then rather than theirs."""
        begun, before = self.started, self.ended
        if self.acked_before is None and self.open and begun and before is not None:
            if before // _MINUTE_MS == begun // _MINUTE_MS:
                return (begun // _MINUTE_MS + 1) * _MINUTE_MS
        return begun

    def as_dict(self) -> dict[str, int | bool | None]:
        ended = None if self.open else self.ended
        return {"number": self.number, "open": self.open, "started": self.started, "ended": ended}


async def read_run(client: Any, keys: Keys) -> RunState | None:
    """The newest run of the crawl of *keys* (None before its first; a field written by
    hand that is no number reads as not recorded)."""
    *fields, acked = await client.hmget(keys.run, "n", "open", "started", "ended", "acked0")
    n, is_open, started, ended = (_number(v) for v in fields)
    if not n or n < 0:
        return None
    return RunState(n, is_open == 1, started, ended, _acked_before(acked, n))


def _acked_before(value: bytes | None, n: int) -> int | None:
    """The acks ``acked0`` says the crawl had when run *n* began; None when it was written
    for another run (a worker of a version before it opened run *n*: a review found run 1's
    value read as run 2's) or is not ``<run>:<acks>``."""
    run, _, acks = (value or b"").partition(b":")
    return _number(acks) if _number(run) == n else None


async def stopped_at(client: Any, keys: Keys) -> int | None:
    """When ``scrapy-ha stop`` stopped the crawl, if no worker started since (server ms;
    None: never stopped, resumed since, or a value no stop wrote). A worker started after
    a stop writes when in the run's ``resumed`` (``scheduler/session/control.py``) at its
    second look at the operator's keys; one that began a run (or ended one) after the
    stop writes that run's ``started`` (``ended``) first: a short run may end before it
    wrote ``resumed`` (a review: such a crawl read "stopped" for ever)."""
    stop = await client.get(keys.stop)
    if stop is None:
        return None
    return stopped_when(stop, await client.hmget(keys.run, *STOP_OVERRIDES))


#: The fields of the run (``Keys.run``) whose time, after a stop's, says a worker ran since.
STOP_OVERRIDES = ("resumed", "started", "ended")


def stopped_when(stop: Any, since: list[Any]) -> int | None:
    """:func:`stopped_at` of what it reads: the stop key's value (None: none) and the run's
    :data:`STOP_OVERRIDES` (for tools that read many crawls in one pipeline)."""
    if stop is None:
        return None
    try:
        at = int(stop)
        later = max((int(value) for value in since if value is not None), default=0)
    except ValueError:
        return None
    return None if at <= later else at


def _number(value: bytes | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


async def _elsewhere(queue: RedisQueue) -> int:
    """Requests a sharded crawl holds outside shard 0 (whose keys the script reads)."""
    others = shards_of(queue)[1:]
    return sum([(await shard.counts()).active for shard in others])


async def _acked_elsewhere(queue: RedisQueue) -> int:
    """Acks a sharded crawl counted outside shard 0 (a count written by hand: none)."""
    found = [await s.client.hget(s.keys.stats, "acked") for s in shards_of(queue)[1:]]
    return sum(_number(v) or 0 for v in found)


async def _ends_elsewhere(queue: RedisQueue) -> int:
    """Requests a sharded crawl acked or dead-lettered outside shard 0."""
    found = [await s.client.hmget(s.keys.stats, "acked", "dead") for s in shards_of(queue)[1:]]
    return sum(_number(v) or 0 for pair in found for v in pair)


def _keys(queue: RedisQueue) -> list[str]:
    k = queue.keys
    return [k.run, k.workers, k.ready, k.leased, k.delayed, k.waiting, k.stats]


async def open_run(queue: RedisQueue, worker: str, heartbeat_ms: int) -> Run:
    """Join the crawl's run in progress, or start the next (see the module's docstring),
    writing *worker*'s heartbeat in the same call."""
    script = queue.client.register_script(scripts.RUN_LUA)
    args = ["open", worker, heartbeat_ms, await _elsewhere(queue), await _acked_elsewhere(queue)]
    number, started = await script(keys=_keys(queue), args=args)
    return Run(int(number), bool(int(started)))


async def end_run(queue: RedisQueue) -> bool:
    """End the run if the crawl holds nothing pending, leased or delayed; True if it did
    (False too when another worker ended it and no request was acked or dead-lettered
    since: each worker that closes on the finished crawl asks)."""
    script = queue.client.register_script(scripts.RUN_LUA)
    args = ["end", await _elsewhere(queue), await _ends_elsewhere(queue)]
    return bool(int(await script(keys=_keys(queue), args=args)))
