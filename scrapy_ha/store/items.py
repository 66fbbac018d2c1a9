"""A crawl's item stream (``HA_ITEMS = "outbox"``), for every process that reads or writes it.

Workers add a page's items in the script call that acks the page (``lua/lib/commit.lua``);
items no page yielded go in on their own (:meth:`ItemStream.add`). Sinks read the stream
with a consumer group each (:mod:`scrapy_ha.sinks`): an entry delivered to a consumer stays
pending in its group until the consumer acknowledges it, which it does only once its sink
has committed it; an entry leaves the stream once every group acknowledged it
(``lua/lib/stream.lua``). A sharded crawl has one stream per shard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from scrapy_ha.store import scripts
from scrapy_ha.store.sharding import shards_of
from scrapy_ha.store.wire import text as _s

if TYPE_CHECKING:
    from scrapy_ha.keys import Keys
    from scrapy_ha.store.queue import RedisQueue

__all__ = [
    "Aside",
    "Delivery",
    "GroupState",
    "ItemStream",
    "StreamState",
    "crawl_items",
    "merged",
    "state_reads",
    "stream_state",
]

#: The field of a stream entry that holds the item (lib/commit.lua).
ITEM_FIELD = b"i"


@dataclass(frozen=True)
class Delivery:
    """One entry as a consumer got it: its id in the stream and the item (``None``: the
    entry was deleted while it waited, which only ``scrapy-ha flush`` does)."""

    id: str
    data: bytes | None


@dataclass(frozen=True)
class GroupState:
    """One consumer group of the stream: a sink."""

    name: str
    consumers: int
    #: entries delivered to its consumers and not acknowledged yet
    pending: int
    #: entries not delivered yet (None: Redis before 7.0 cannot say)
    lag: int | None
    #: entries it acknowledged (the crawl-wide counter ``items_consumed:<group>``)
    consumed: int = 0
    #: entries it ever set aside (the counter ``items_aside:<group>``; ``--retry-aside``
    #: does not lower it: :attr:`StreamState.aside` holds the records still waiting)
    set_aside: int = 0

    @property
    def backlog(self) -> int:
        """Entries its sink has not committed yet: pending, plus those not delivered."""
        return self.pending + (self.lag or 0)


@dataclass(frozen=True)
class StreamState:
    """The item stream of a crawl (every shard's, summed) at one instant."""

    #: entries in the stream now: not acknowledged by every group yet
    length: int = 0
    groups: list[GroupState] = field(default_factory=list)
    #: records in the set-aside stream now, every group's (``--retry-aside`` deletes those
    #: it wrote; the groups' ``set_aside`` counters never go down)
    aside: int = 0

    @property
    def backlog(self) -> int:
        """The largest backlog of a group (the slowest sink); the stream's length when no
        group reads it yet."""
        return max((g.backlog for g in self.groups), default=self.length)


class ItemStream:
    """The item stream of one crawl (of one shard of it), on a ``redis.asyncio`` client."""

    def __init__(self, client: Any, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self.key = keys.items
        self._add = client.register_script(scripts.ITEMS_ADD_LUA)
        self._ack = client.register_script(scripts.ITEMS_ACK_LUA)
        self._aside = scripts.Registered(client, "items_aside")
        self._leave = scripts.Registered(client, "items_leave")

    async def add(self, items: list[bytes], sender: tuple[str, int] | None = None) -> int:
        """Add items no page yielded (no lease fences them); return how many the stream
        holds now. With *sender* (the worker's nonce, the number of ``items[0]``), items an
        earlier call whose reply was lost added are not added again."""
        if not items:
            return 0
        keys = [self.key, *self.keys.stats_keys(), self.keys.sent]
        head = f"{sender[0]} {sender[1]}" if sender else "-"
        return int(await self._add(keys=keys, args=[head, *items]))

    async def state(self) -> StreamState:
        """The stream's length and its groups (one round trip)."""
        pipe = self.client.pipeline(transaction=False)
        state_reads(pipe, self.keys)
        reply, counters = await pipe.execute()
        return stream_state(reply, counters)

    async def join(self, group: str) -> int | None:
        """Create *group* if it is new: it reads the stream from its first entry still in
        it. Returns None for a group that existed, else how many items were committed and
        trimmed before it (other groups had consumed them: this sink misses them)."""
        try:
            await self.client.xgroup_create(self.key, group, id="0", mkstream=True)
        except redis.exceptions.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
            return None
        committed, length = (
            await self.client.hget(self.keys.stats, "items"),
            await self.client.xlen(self.key),
        )
        return max(0, int(committed or 0) - int(length))

    async def read(
        self,
        group: str,
        consumer: str,
        count: int,
        *,
        own: bool = False,
        after: str = "0",
        block_ms: int = 0,
    ) -> list[Delivery]:
        """Up to *count* entries for *consumer*: new ones, or with *own* those delivered
        to it before and not acknowledged (after a restart of its sink), from the first
        after id *after*."""
        reply = await self.client.xreadgroup(
            group,
            consumer,
            {self.key: after if own else ">"},
            count=count,
            block=None if own or not block_ms else block_ms,
        )
        return _deliveries(reply)

    async def claim(self, group: str, consumer: str, idle_ms: int, count: int) -> list[Delivery]:
        """Up to *count* entries other consumers of *group* were delivered and have not
        acknowledged for *idle_ms*, now *consumer*'s (a consumer that died mid-batch)."""
        reply = await self.client.xautoclaim(
            self.key, group, consumer, idle_ms, start_id="0-0", count=count
        )
        return [Delivery(_s(i), _item(f)) for i, f in reply[1] if i is not None]

    async def pending_of(self, group: str, consumer: str) -> int:
        """Entries delivered to *consumer* and not acknowledged."""
        rows = await self.client.xpending_range(
            self.key, group, min="-", max="+", count=1_000_000, consumername=consumer
        )
        return len(rows)

    async def leave(self, group: str, consumer: str) -> bool:
        """Take *consumer* out of *group* if it owes no entry (items_leave.lua); True if it
        left."""
        return bool(await self._leave(keys=[self.key], args=[group, consumer]))

    async def prune(self, group: str, consumer: str, idle_ms: int) -> int:
        """Take out of *group* the other consumers that owe nothing and have not read for
        *idle_ms* (each by :meth:`leave`, which checks it owes nothing in the same call):
        a consumer killed cannot leave, and ``status`` counted it for ever. One still
        running is back at its next read that gets entries; return how many left."""
        gone = 0
        for info in await self.client.xinfo_consumers(self.key, group):
            name = _s(info["name"])
            if name != consumer and not info["pending"] and info["idle"] >= idle_ms:
                gone += await self.leave(group, name)
        return gone

    async def ack(self, group: str, ids: list[str]) -> tuple[int, int]:
        """Acknowledge entries *group*'s sink committed; return (acknowledged now, entries
        trimmed: those every group has acknowledged)."""
        keys = [self.key, *self.keys.stats_keys(), self.keys.items_tries]
        acked, trimmed = await self._ack(keys=keys, args=[group, *ids])
        return int(acked), int(trimmed)

    async def begin_single(self, group: str, entry_id: str) -> int:
        """Count one more single write of *entry_id* begun by *group*'s consumers (kept
        until :meth:`end_single`: a count left there is a consumer that died writing it);
        return the count."""
        return int(await self.client.hincrby(self.keys.items_tries, _try_field(group, entry_id)))

    async def end_single(self, group: str, entry_id: str) -> None:
        """The single write of *entry_id* returned (committed or raised): not a death."""
        await self.client.hdel(self.keys.items_tries, _try_field(group, entry_id))

    async def set_aside(self, group: str, consumer: str, entry_id: str, reason: str) -> int:
        """Copy *entry_id* with *reason* to the set-aside stream and acknowledge it in
        *group*, in one call (items_aside.lua); return 1 if set aside, 0 if it was not
        pending in the group any more, -1 if it is pending to another consumer."""
        keys = [self.key, self.keys.items_aside, self.keys.items_tries, *self.keys.stats_keys()]
        args = [group, consumer, entry_id, reason_text(reason), _try_field(group, entry_id)]
        done, _ = await self._aside(keys=keys, args=args)
        return int(done)

    async def aside(self, group: str) -> list[Aside]:
        """The records *group* set aside in this stream, oldest first (fields as stored:
        bytes; a record without one of them is kept as it is, for the operator)."""
        rows = await self.client.xrange(self.keys.items_aside)
        wanted = group.encode()
        return [Aside(_s(rid), fields) for rid, fields in rows if _field(fields, "g") == wanted]

    async def has_group(self, group: str) -> bool:
        """Whether consumer group *group* reads this stream."""
        if not await self.client.exists(self.key):
            return False
        infos = await self.client.xinfo_groups(self.key)
        return any(_s(info["name"]) == group for info in infos)

    async def drop_aside(self, record_id: str) -> int:
        """Delete one set-aside record (once its entry is in the sink)."""
        return int(await self.client.xdel(self.keys.items_aside, record_id))


@dataclass(frozen=True)
class Aside:
    """One record of the set-aside stream: an entry a group's sink could not write."""

    record_id: str
    fields: dict[Any, Any]

    @property
    def entry_id(self) -> str | None:
        value = _field(self.fields, "e")
        return value.decode("utf-8", "replace") if value is not None else None

    @property
    def item(self) -> bytes | None:
        """The item as the stream held it, byte for byte."""
        return _field(self.fields, "i")

    @property
    def reason(self) -> str:
        return (_field(self.fields, "r") or b"").decode("utf-8", "replace")

    @property
    def when_ms(self) -> int:
        value = (_field(self.fields, "t") or b"").decode("ascii", "replace")
        return int(value) if value.isdigit() else 0


def _field(fields: dict[Any, Any], name: str) -> bytes | None:
    value = fields.get(name.encode(), fields.get(name))
    return value if isinstance(value, bytes) or value is None else str(value).encode()


#: Longest reason kept with an entry set aside, in characters (a traceback's last lines).
REASON_CHARS = 1000


def reason_text(reason: str) -> bytes:
    """*reason* as UTF-8 that any reader decodes: cut to :data:`REASON_CHARS` characters,
    a lone surrogate escaped."""
    return reason[:REASON_CHARS].encode("utf-8", "backslashreplace")


def _try_field(group: str, entry_id: str) -> str:
    return f"{entry_id} {group}"


def state_reads(pipe: Any, keys: Keys) -> None:
    """Queue on *pipe* (of a sync or an asyncio client) the two reads of
    :func:`stream_state`."""
    pipe.eval(scripts.ITEMS_STATE_LUA, 2, keys.items, keys.items_aside)
    pipe.hgetall(keys.stats)


def stream_state(reply: list[Any], counters: dict[Any, Any]) -> StreamState:
    """items_state.lua's *reply* and the crawl's *counters* as a :class:`StreamState`."""
    counts = {_s(k): _s(v) for k, v in counters.items()}
    length = int(reply[0])
    groups = []
    for i in range(2, len(reply), 4):
        name, consumers, pending, lag = _s(reply[i]), *map(int, reply[i + 1 : i + 4])
        # Not delivered yet means still in the stream (an entry leaves it once every group
        # acknowledged it): Redis's lag, a counter it estimates, was seen at 812 for a
        # stream of 0 entries, and a backlog that never emptied kept `items --exit-idle`
        # waiting for ever on a crawl that had ended.
        lag = min(lag, length)
        consumed = counts.get(f"items_consumed:{name}", "0")
        aside = counts.get(f"items_aside:{name}", "0")
        groups.append(
            GroupState(
                name,
                consumers,
                pending,
                None if lag < 0 else lag,
                int(consumed) if consumed.isdigit() else 0,
                int(aside) if aside.isdigit() else 0,
            )
        )
    return StreamState(length, groups, int(reply[1]) if len(reply) > 1 else 0)


def merged(states: list[StreamState]) -> StreamState:
    """The state of a sharded crawl's streams as one: lengths and groups summed."""
    groups: dict[str, GroupState] = {}
    for state in states:
        for g in state.groups:
            old = groups.get(g.name)
            if old is not None:
                lag = None if old.lag is None or g.lag is None else old.lag + g.lag
                g = GroupState(
                    g.name,
                    max(old.consumers, g.consumers),
                    old.pending + g.pending,
                    lag,
                    old.consumed + g.consumed,
                    old.set_aside + g.set_aside,
                )
            groups[g.name] = g
    return StreamState(
        sum(s.length for s in states),
        sorted(groups.values(), key=_name),
        sum(s.aside for s in states),
    )


def _name(group: GroupState) -> str:
    return group.name


def _item(fields: Any) -> bytes | None:
    """The item of an entry's fields; None for an entry deleted while pending (no fields),
    ``b""`` for one without the item's field (written by hand: set aside, not dropped)."""
    if not fields:
        return None
    value = fields.get(ITEM_FIELD, fields.get(_s(ITEM_FIELD)))
    if value is None:
        return b""
    return value if isinstance(value, bytes) else str(value).encode()


def _deliveries(reply: Any) -> list[Delivery]:
    """XREADGROUP's reply (``[[stream, [(id, fields), ...]]]``) as deliveries."""
    return [Delivery(_s(i), _item(f)) for _, entries in reply or [] for i, f in entries]


async def crawl_items(queue: RedisQueue) -> StreamState:
    """The item streams of *queue*'s crawl (every shard's) as one."""
    return merged([await ItemStream(q.client, q.keys).state() for q in shards_of(queue)])
