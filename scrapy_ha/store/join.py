"""How a worker joins its crawl in Redis, and when the crawl's layout may change.

A worker joins before its first heartbeat, in one script under the crawl's own tag
(``join.lua``):

- while the last worker of a sharded crawl clears its shards (:mod:`.finish`, one slot
  after the other), a worker that comes waits, and clears them itself if that
  worker died before it was done: a finish is all or nothing;
- a worker whose ``HA_SHARDS`` differs from the crawl's is refused while the crawl runs,
  stopped before its end, or keeps its state (``SCHEDULER_PERSIST``), and takes the crawl
  over once a finish cleared it:

  - from several shards to several: the earlier shards stay in the layout
    (``"<count> <span>"``, see :func:`~scrapy_ha.store.sharding.read_layout`), so what the finished
    run kept there (dead letters, counters) is read with the new shards, by the workers and
    by every tool;
  - between one shard and several, the hash tags differ: what the finished run keeps would
    be out of reach, so the worker is refused while it keeps dead letters, items its sinks
    have not all consumed or set aside (or requests pushed or requeued since it finished;
    the error says what to do); else its counters, the
    only thing left under those tags, are deleted (INFO), and an SQL archive declared
    there is declared under the new ones (:data:`ARCHIVE_MARK`);

- the number in ``sent`` of a worker whose heartbeat expired is deleted once it has been
  gone for :data:`~scrapy_ha.store.wire.SENT_GRACE_MS` (a day; a finish prunes them too).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy_ha.config.validate import ConfigError
from scrapy_ha.keys import Keys
from scrapy_ha.store import scripts
from scrapy_ha.store.finish import complete_finish
from scrapy_ha.store.sharding import layout_keys, make_queue, read_layout, shards_of
from scrapy_ha.store.shards import ShardedQueue
from scrapy_ha.store.wire import SENT_GRACE_MS, _s

if TYPE_CHECKING:
    from typing import Any

    from scrapy_ha.store.queue import RedisQueue

__all__ = ["Joined", "join_crawl", "leave_crawl"]

logger = logging.getLogger(__name__)

#: Seconds between two attempts to join while a finish clears the crawl: a finish of a few
#: shards takes milliseconds, one of 1,024 seconds.
JOIN_POLL = 0.25
#: The field of a crawl's ``dead_archived`` that declares an SQL archive (lib/deadletter.lua:
#: retention and purge keep what no archive holds): kept when the layout changes.
ARCHIVE_MARK = "~archive"
#: The layout of a crawl of one shard, as join.lua names it (it has no layout key).
ONE_SHARD = "1"


@dataclass(frozen=True)
class Joined:
    """The crawl this worker joined: its shard count and span (the shards its keys are on),
    the layout of a finished run it took over ('' when none), and whether the crawl had
    finished (its join deleted the finish record: :func:`leave_crawl` writes it back)."""

    shards: int
    span: int
    replaced: str = ""
    finished: bool = False


async def join_crawl(
    client: Any,
    prefix: str,
    spider: str,
    *,
    shards: int,
    worker: str,
    registration_ms: int,
    sender: str = "",
    sent_grace_ms: int = SENT_GRACE_MS,
) -> Joined:
    """Join the crawl of *spider* with *shards* shards (see the module's docstring).

    *registration_ms*: how long the registration lasts before the worker's first heartbeat
    (the heartbeat TTL); *sender*: the worker's nonce in ``sent`` (an unsharded crawl);
    *sent_grace_ms*: how long the number of a worker gone is kept.
    A crawl this worker may not join raises :class:`ConfigError`, naming what to do."""
    keys = Keys(prefix, spider)
    script = client.register_script(scripts.JOIN_LUA)
    where = keys.workers if shards == 1 else keys.joins
    names = [keys.shard_count, keys.finish_record, where, keys.senders, keys.sent, *keys.all()]
    waiting = False
    while True:
        stored = await client.get(keys.shard_count)
        replaceable = await _replaceable(client, keys, stored, shards)
        args = [worker, shards, registration_ms, sender if shards == 1 and sender else "-"]
        reply = await script(keys=names, args=[*args, replaceable, sent_grace_ms])
        kind = _s(reply[0])
        if kind == "joined":
            joined = Joined(shards, int(reply[2]), _s(reply[1]), reply[3:4] == [1])
            if joined.replaced:
                await _took_over(client, keys, joined)
            return joined
        if kind == "wait":
            if not waiting:
                waiting = True
                logger.info("The crawl of %s is being cleared by its finish: waiting", spider)
            await asyncio.sleep(min(int(reply[1]) / 1000, JOIN_POLL))
        elif kind == "complete":
            await _complete(client, keys, stored, _s(reply[1]))
        else:
            raise ConfigError(await _refusal(client, keys, shards, reply))


async def leave_crawl(client: Any, prefix: str, spider: str, joined: Joined, worker: str) -> None:
    """Undo :func:`join_crawl`'s registration of *worker*, refused after it joined (its
    dupefilter of another kind, a Bloom filter too large): counted live until its
    registration expired, it kept ``flush`` (which the refusal names as the fix) from
    running (a QA finding). A crawl that had finished is recorded finished again unless
    another worker joined it meanwhile: else a worker with another ``HA_SHARDS`` was refused
    as if it ran (a review finding). What a join that took over a finished crawl of another
    layout did stays done (that crawl kept nothing but counters)."""
    keys = Keys(prefix, spider)
    where = keys.workers if joined.shards == 1 else keys.joins
    script = client.register_script(scripts.LEAVE_LUA)
    await script(keys=[where, keys.finish_record], args=[worker, int(joined.finished)])


def _layout_name(stored: bytes | None) -> str:
    return ONE_SHARD if stored is None else _s(stored)


def _old_queue(client: Any, keys: Keys, layout: str) -> RedisQueue:
    """The queue of the crawl as *layout* has it."""
    count, span = read_layout(layout)
    return make_queue(client, keys.prefix, keys.spider, count, span=span)


async def _kept(client: Any, keys: Keys, layout: str) -> tuple[int, int, int, int]:
    """(dead letters, requests to crawl, items its sinks have not all consumed, items a sink
    set aside) the crawl keeps under *layout*."""
    queue = _old_queue(client, keys, layout)
    counts = await queue.counts()
    items = [await client.xlen(shard.keys.items) for shard in shards_of(queue)]
    aside = [await client.xlen(shard.keys.items_aside) for shard in shards_of(queue)]
    return counts.dead, counts.active, sum(items), sum(aside)


async def _replaceable(client: Any, keys: Keys, stored: bytes | None, shards: int) -> str:
    """The layout in Redis if this worker may take it over once the crawl finished, else
    '-': from several shards to several always; between one and several only while the
    other layout keeps no dead letter, no request, no item left to consume and no item set
    aside (its tags are not read by the new one)."""
    layout = _layout_name(stored)
    count = read_layout(layout)[0]
    if count == shards:
        return "-"
    if count > 1 and shards > 1:
        return layout
    return "-" if any(await _kept(client, keys, layout)) else layout


async def _took_over(client: Any, keys: Keys, joined: Joined) -> None:
    """This worker took over a finished crawl of another layout: say so; between one shard
    and several, delete what the finished run kept under tags the new layout does not read."""
    before = read_layout(joined.replaced)[0]
    if before > 1 and joined.shards > 1:
        logger.info(
            "The crawl of %s finished with HA_SHARDS=%d and now runs with HA_SHARDS=%d: what "
            "the finished run kept (dead letters, counters) stays on its shards, read with "
            "the new ones (%d in all)",
            keys.spider,
            before,
            joined.shards,
            joined.span,
        )
        return
    old = layout_keys(keys.prefix, keys.spider, joined.replaced).every_shard()
    archive = [await client.hget(shard.dead_archived, ARCHIVE_MARK) for shard in old]
    for shard in old:  # one call per shard: each is one slot
        await client.delete(*(name for name in shard.all() if name != shard.feed_guard))
    for url in {u for u in archive if u is not None}:  # still declared in the new layout
        for shard in layout_keys(keys.prefix, keys.spider, str(joined.shards)).every_shard():
            await client.hsetnx(shard.dead_archived, ARCHIVE_MARK, url)
    if joined.shards == 1:
        await client.delete(keys.joins)
    logger.info(
        "The crawl of %s finished with HA_SHARDS=%d and now runs with HA_SHARDS=%d: the "
        "counters the finished run kept on its %d hash tag(s) are deleted (the new layout "
        "reads other tags); it kept no dead letter",
        keys.spider,
        before,
        joined.shards,
        len(old),
    )


async def _complete(client: Any, keys: Keys, stored: bytes | None, token: str) -> None:
    """Clear the shards of a finish whose worker died after deciding it."""
    count, span = read_layout(stored)
    queue = make_queue(client, keys.prefix, keys.spider, count, span=span)
    if not isinstance(queue, ShardedQueue):  # a record only a sharded finish writes
        await client.delete(keys.finish_record)
        return
    if await complete_finish(queue, token):
        logger.warning(
            "The last worker of the crawl of %s stopped while its finish cleared its %d "
            "shards: this worker cleared them",
            keys.spider,
            len(queue.shards),
        )


async def _refusal(client: Any, keys: Keys, shards: int, reply: list[Any]) -> str:
    """Why this worker may not join (join.lua's 'other' reply), and what to do."""
    layout, done = _s(reply[1]), int(reply[2])
    have = read_layout(layout)[0]
    spider = keys.spider
    where = "unsharded (HA_SHARDS=1)" if have == 1 else f"with HA_SHARDS={have}"
    if not done:  # unsharded: no layout key, but its keys (a sink declared makes some)
        key = f" (key {keys.shard_count})" if have > 1 else ""
        sink = ", or a sink was declared without --shards" if have == 1 else ""
        again = f"; then declare its sinks with --shards {shards} --declare" if have == 1 else ""
        return (
            f"HA_SHARDS={shards} but the crawl of {spider} is in Redis {where}{key} and "
            f"has not finished (it runs, stopped before its end, or keeps its state: "
            f"SCHEDULER_PERSIST=True{sink}): run it with HA_SHARDS={have}, or `scrapy-ha "
            f"flush {spider}` first to start it again (dead letters and counters "
            f"included{again})"
        )
    dead, active, items, aside = await _kept(client, keys, layout)
    return (
        f"HA_SHARDS={shards} but the crawl of {spider} finished {where} and keeps {dead} "
        f"dead letter(s) and {active} request(s) to crawl there"
        + (f", and {items} item(s) its sinks have not all consumed" if items else "")
        + (f", and {aside} item(s) a sink set aside" if aside else "")
        + f", which a crawl with {'several shards' if shards > 1 else 'one'} would not read "
        f"(other hash tags): run it with HA_SHARDS={have}, or archive and purge its dead "
        f"letters first (`scrapy-ha dlq list {spider}`)"
        + (f" and consume its items (`scrapy-ha items {spider} --to ...`)" if items else "")
        + (
            f" and write its set-aside items (`scrapy-ha items {spider} --to ... --retry-aside`)"
            if aside
            else ""
        )
    )
