"""A consumer of the item stream: reads it in a consumer group, hands each batch to a sink,
and acknowledges an entry only once the sink has committed it.

The guarantee: **every item committed to the stream reaches the sink once**, whenever the
consumer (or its sink) dies. An entry delivered to a consumer stays pending in its group
until acknowledged; a consumer started again under its name reads its own pending entries
first, and a sink that shares its work (an SQL table) lets another consumer of the group
take over the entries a consumer left pending for ``claim_idle`` seconds. Either may hand
the sink an entry it committed before the kill: a sink writes idempotently, keyed by the
entry's id (see :class:`Sink`). Several consumers of one group share the work; each sink
has its own group and gets every item. An entry leaves the stream once every group has
acknowledged it (``lua/lib/stream.lua``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import redis.exceptions
from scrapy.settings import Settings

from scrapy_ha.config.items import DEFAULT_BATCH, DEFAULT_BLOCK, DEFAULT_CLAIM_IDLE
from scrapy_ha.config.scheduler import DEFAULT_CONNECT_TIMEOUT
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.keys import DEFAULT_PREFIX
from scrapy_ha.sinks.batches import BatchWriter, ConsumerReport, Entry, route
from scrapy_ha.sinks.gone import GroupGone, StreamGone, refused_read
from scrapy_ha.store.connection import REDIS_DOWN_ERRORS, redis_from_settings
from scrapy_ha.store.items import ItemStream
from scrapy_ha.store.runs import stopped_at
from scrapy_ha.store.sharding import queue_in_redis, shards_of

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from scrapy_ha.store.queue import RedisQueue

__all__ = [
    "ConsumerReport",
    "Entry",
    "GroupGone",
    "ItemConsumer",
    "Sink",
    "SinkDidNotOpen",
    "StreamGone",
    "consume",
    "default_consumer",
]

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: Longest wait between two tries while Redis is unreachable (the workers' own cap,
#: ``HA_RECONNECT_MAX_DELAY``'s default).
RECONNECT_MAX_DELAY = 10.0


class SinkDidNotOpen(Exception):
    """The sink could not open (its database unreachable, its file not writable)."""


class Sink(Protocol):
    """Where a consumer puts items. ``write`` must commit durably before it returns, and
    idempotently: an entry written again (after a kill between the commit and the
    acknowledgement) must not be stored twice. A sink whose idempotence is its own
    (``shares = False``) may have a ``consumer`` attribute: the name a consumer started
    again must take to find the entries it left pending (:class:`JsonLinesSink`'s: host and
    path); :class:`ItemConsumer` takes it when it is given no name."""

    #: a consumer may take over the entries another consumer of the group left pending
    #: (the sink's idempotence holds across consumers: a shared table); False for a sink
    #: whose idempotence is its own (a file): only a consumer started again under the
    #: same name finishes what it left
    shares: bool

    async def open(self) -> list[str]:
        """Get ready; return the ids of entries committed before a restart that may not
        have been acknowledged (the consumer acknowledges them before anything else)."""

    async def write(self, entries: list[Entry]) -> int | None:
        """Commit *entries*; raise to have them delivered again later. Return how many it
        stored (not dropped or left out): a write that stored none is no proof that the
        sink works (:mod:`.isolate`); None counts as all of them."""

    async def close(self) -> None: ...


def default_consumer() -> str:
    """``host:pid``: a consumer of its own per process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def sink_consumer(sink: Sink) -> str:
    """The consumer name of *sink* when none is given: the sink's own ``consumer`` if it has
    one (a file's: the same after a restart, so that it finds its pending entries again),
    else :func:`default_consumer`."""
    own = getattr(sink, "consumer", None)
    return str(own) if own else default_consumer()


class ItemConsumer:
    """Reads a crawl's item stream (every shard's) for one consumer of one group."""

    def __init__(
        self,
        queue: RedisQueue,
        sink: Sink,
        *,
        group: str,
        consumer: str | None = None,
        batch: int = DEFAULT_BATCH,
        claim_idle: float = DEFAULT_CLAIM_IDLE,
        block: float = DEFAULT_BLOCK,
        deaths: int = 0,
    ) -> None:
        self.queue = queue
        self.streams = [ItemStream(q.client, q.keys) for q in shards_of(queue)]
        self.sink = sink
        self.group = group
        self.consumer = consumer or sink_consumer(sink)
        self.batch = batch
        self.claim_idle_ms = int(claim_idle * 1000)
        self.block_ms = int(block * 1000)
        self.report = ConsumerReport()
        #: writes each batch, acknowledges what the sink committed; its ``failed``: a batch
        #: failed, or a read's reply was lost: its entries wait among this consumer's own
        #: (pending to it), read again before new ones
        #: *deaths*: set an entry aside once that many consumers died writing it alone (0:
        #: never; see :mod:`.batches` for why it is off by default)
        self.writer = BatchWriter(sink, self.streams, group, self.consumer, self.report, deaths)
        self._made: list[ItemStream] = []  # the streams :meth:`join` made the group in

    async def run(
        self, *, stop: asyncio.Event | None = None, exit_idle: float | None = None
    ) -> ConsumerReport:
        """Consume until *stop* is set, or, with *exit_idle*, once the crawl has ended (no
        live worker, nothing pending, leased or delayed) and the group's backlog stayed
        empty for *exit_idle* seconds. The sink is closed at the end."""
        stop = stop or asyncio.Event()
        # (Redis away as it starts, a failover, is waited for as in the loop: each step may
        # run again) first the group: items other groups consume meanwhile stay for this one
        await self._until_up(self.join)
        recovered = await self._open()
        try:
            await self._until_up(lambda: self._settle_in(recovered, stop))
            idle_since, delay = time.monotonic(), 0.0
            while not stop.is_set():
                try:
                    worked = await self._round(stop)
                    if not worked and exit_idle is not None:
                        if time.monotonic() - idle_since >= exit_idle and await self._ended():
                            break
                except REDIS_DOWN_ERRORS as exc:  # a batch not acknowledged comes again
                    self.writer.failed = True  # a read whose reply was lost: its entries are ours
                    delay = await _away(exc, delay)
                    continue
                except redis.exceptions.ResponseError as exc:
                    away = await refused_read(exc, self.streams, self.group)
                    self.writer.failed = True
                    delay = await _away(away, delay)
                    continue
                delay = 0.0
                if worked or exit_idle is not None and time.monotonic() - idle_since >= exit_idle:
                    idle_since = time.monotonic()
        finally:
            await self.sink.close()
        await self._leave()
        return self.report

    async def _settle_in(self, recovered: list[str], stop: asyncio.Event) -> None:
        """Acknowledge what the sink recovered, prune consumers killed owing nothing
        (``status`` counted them), finish this consumer's own entries."""
        await self.acknowledge_recovered(recovered)
        for stream in self.streams:
            await stream.prune(self.group, self.consumer, self.claim_idle_ms)
        for shard in range(len(self.streams)):
            await self._drain_own(shard, stop, restart=True)

    async def _until_up(self, step: Callable[[], Awaitable[T]]) -> T:
        """*step*'s result, run again while Redis does not answer."""
        delay = 0.0
        while True:
            try:
                return await step()
            except REDIS_DOWN_ERRORS as exc:  # (a read's reply lost: read again, as below)
                self.writer.failed = True
                delay = await _away(exc, delay)

    async def _open(self) -> list[str]:
        """Open the sink; what it recovered. The group this consumer made goes again if it
        does not open, failed or given up (a second Ctrl-C, cli/items.py): a group nobody
        consumes would keep every item for ever."""
        try:
            return await self.sink.open()
        except asyncio.CancelledError:
            await self._forget_new_group()
            raise
        except Exception as exc:
            await self._forget_new_group()
            if isinstance(exc, ConfigError):  # says what is wrong (a file another one holds)
                raise
            why = (str(exc).strip() or type(exc).__name__).splitlines()[0]
            raise SinkDidNotOpen(f"the sink did not open: {why}") from exc

    async def _leave(self) -> None:
        """Leave the group where this consumer owes nothing (``status`` counts consumers
        running or owing entries); one that owes entries stays, to finish them when it
        starts again under its name or to be taken over."""
        for stream in self.streams:
            try:
                await stream.leave(self.group, self.consumer)
            except REDIS_DOWN_ERRORS as exc:  # its name stays: counted, harmless
                logger.debug("Could not leave group %s: %s", self.group, exc)

    async def join(self) -> int:
        """Create the group in every shard's stream if it is new (a sink declared before
        the crawl gets every item); return how many items it missed: committed and trimmed
        before it existed (a WARNING says so)."""
        missed = 0
        self._made = []
        for stream in self.streams:
            found = await stream.join(self.group)
            if found is not None:  # made by this call
                self._made.append(stream)
            missed += found or 0
        if missed:
            logger.warning(
                "Consumer group %s is new: %d item(s) committed before it existed were "
                "consumed by the other groups and trimmed, and this sink misses them: items "
                "of earlier runs of the crawl, or of this run if it started before this sink "
                "was declared (declare every sink before the crawl: scrapy-ha items SPIDER "
                "--to SINK --declare)",
                self.group,
                missed,
            )
        return missed

    async def _forget_new_group(self) -> None:
        """Take away the group this consumer's :meth:`join` made, if no consumer of it has
        read anything yet (its sink did not open)."""
        for stream in self._made:
            for info in await stream.client.xinfo_groups(stream.key):
                name = info["name"].decode() if isinstance(info["name"], bytes) else info["name"]
                if name == self.group and not (info["consumers"] or info["pending"]):
                    await stream.client.xgroup_destroy(stream.key, self.group)

    async def acknowledge_recovered(self, ids: list[str]) -> None:
        by: dict[int, list[str]] = {}
        for entry_id in ids:
            shard, local = route(entry_id)
            by.setdefault(shard, []).append(local)
        for shard, local_ids in by.items():
            acked, _ = await self.streams[shard].ack(self.group, local_ids)
            self.report.recovered += acked

    async def _drain_own(self, shard: int, stop: asyncio.Event, *, restart: bool = False) -> None:
        """What this consumer was delivered before and did not acknowledge, each entry
        once (a suspect stays pending); with *restart* (what a consumer that died left),
        one entry at a time, each single write counted (see :meth:`_single`)."""
        after = "0"
        while not stop.is_set():
            stream = self.streams[shard]
            own = await stream.read(self.group, self.consumer, self.batch, own=True, after=after)
            if not own:
                return
            after = own[-1].id
            await self.writer.commit(shard, own, restart=restart)

    async def _round(self, stop: asyncio.Event) -> bool:
        """One pass over the streams; True if anything was committed."""
        await self.writer.acknowledge_committed()
        self.writer.new_round()
        if self.writer.failed or self.writer.suspects:
            self.writer.failed = False
            for shard in range(len(self.streams)):
                await self._drain_own(shard, stop)
        worked, quiet = False, []
        many = len(self.streams) > 1
        for shard, stream in enumerate(self.streams):
            if self.sink.shares:
                taken = await stream.claim(
                    self.group, self.consumer, self.claim_idle_ms, self.batch
                )
                if taken:  # its consumer died (or stalled): its name goes once it owes none
                    self.report.claimed += len(taken)
                    await stream.prune(self.group, self.consumer, self.claim_idle_ms)
                    worked = await self.writer.commit(shard, taken, restart=True) or worked
            block = 0 if many or worked else self.block_ms
            fresh = await stream.read(self.group, self.consumer, self.batch, block_ms=block)
            if fresh:
                worked = await self.writer.commit(shard, fresh) or worked
            else:
                quiet.append(shard)
            if stop.is_set():
                break
        if not worked and self.writer.suspects:
            await self._settle(quiet)
        if many and not worked and not stop.is_set():
            try:  # several streams cannot share one blocking read: wait between passes
                async with asyncio.timeout(self.block_ms / 1000):
                    await stop.wait()
            except TimeoutError:
                pass
        return worked

    async def _settle(self, shards: list[int]) -> None:
        """No new entry came in *shards*: suspects that are all this consumer has pending
        there may be set aside without proof (:meth:`BatchWriter.settle`)."""
        for shard in shards:
            pending = await self.streams[shard].pending_of(self.group, self.consumer)
            await self.writer.settle(shard, pending)

    async def _ended(self) -> bool:
        """The crawl ran and ended (no live worker, and nothing left to crawl or a
        ``scrapy-ha stop``: a continuous crawl never runs out of work; a crawl that has not
        started yet has not ended) and the group has nothing left to commit, but entries
        that failed alone here with no other entry left to prove the sink works (stuck: a
        WARNING names how many; they stay pending)."""
        counts = await self.queue.counts()
        if counts.workers or not await self._started():
            return False
        if counts.active and not await self._stopped():
            return False
        states = [await stream.state() for stream in self.streams]
        backlog = sum(g.backlog for s in states for g in s.groups if g.name == self.group)
        if not backlog:
            return True
        if not self.writer.suspects or backlog > await self._pending_here():
            return False
        self.report.stuck = backlog
        logger.warning(
            "The crawl ended; %d item(s) stay pending in group %s: each failed alone and no "
            "other entry was left to prove the sink works (see the WARNINGs naming them); "
            "run the consumer again once the sink or the items are fixed",
            backlog,
            self.group,
        )
        return True

    async def _pending_here(self) -> int:
        """Entries pending to this consumer that are its suspects (failed alone here)."""
        pending = sum([await s.pending_of(self.group, self.consumer) for s in self.streams])
        return pending if pending <= len(self.writer.suspects) else -1

    async def _stopped(self) -> bool:
        """``scrapy-ha stop`` stopped the crawl and no worker resumed it since."""
        return await stopped_at(self.queue.client, self.queue.keys) is not None

    async def _started(self) -> bool:
        """The crawl ever queued a request or committed an item (counters outlive it)."""
        for stream in self.streams:
            counts = await stream.client.hmget(stream.keys.stats, ["enqueued", "items"])
            if any(int(n or 0) for n in counts):
                return True
        return False


async def _away(exc: Exception, delay: float) -> float:
    """Wait for Redis after *exc*: the next delay (doubling from 0.25 s), said in a WARNING."""
    delay = min(RECONNECT_MAX_DELAY, max(0.25, delay * 2))
    logger.warning("Redis unreachable (%s); retrying in %.2f s", exc, delay)
    await asyncio.sleep(delay)
    return delay


async def consume(
    url: str,
    spider: str,
    sink: Sink,
    *,
    group: str,
    prefix: str = DEFAULT_PREFIX,
    stop: asyncio.Event | None = None,
    exit_idle: float | None = None,
    **options: Any,
) -> ConsumerReport:
    """Consume *spider*'s item stream in the Redis at *url* (any URL ``REDIS_URL`` takes;
    keys under *prefix*) into *sink*, as consumer group *group*; *options* are
    :class:`ItemConsumer`'s (``consumer``, ``batch``, ``claim_idle``, ``block``,
    ``deaths``). Runs until *stop* is set, or, with *exit_idle*, until the crawl has
    ended and its items are in the sink (see :meth:`ItemConsumer.run`)."""
    settings = Settings({"REDIS_URL": url})
    client = redis_from_settings(settings, connect_timeout=DEFAULT_CONNECT_TIMEOUT)
    try:
        queue = await queue_in_redis(client, prefix, spider)  # every shard the layout spans
        consumer = ItemConsumer(queue, sink, group=group, **options)
        return await consumer.run(stop=stop, exit_idle=exit_idle)
    finally:
        await client.aclose()
