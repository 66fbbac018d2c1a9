"""The crawl's domain gates, as an operator sees and opens them (``scrapy-ha gates``).

A 429 (or a 503 with ``Retry-After``) closes its domain for every worker for the retry's
delay (the site's ``Retry-After``, at most ``HA_RETRY_AFTER_MAX``): ``ha:{S}:gates``,
domain -> the server ms it opens. An operator who knows the site is fine again (its ban
was lifted, the crawl's address was allowed) opens it early: the gate leaves the hash and
its change is logged (``store/lua/gate_open.lua``), so that each worker's next sync opens
its copy; what waited behind it goes at once: its host's back queues parked in ``waiting``
are made due there, and so are its delayed entries that waited for it (deferred for the
gate, or retries of a 429). A sharded crawl closes a gate in every shard: it is opened in
every shard.
"""

from __future__ import annotations

__all__ = ["Opened", "closed_gates", "domain_of", "gates_closed", "open_gates"]

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy_ha.codec import describe
from scrapy_ha.ops.operations import BATCH, server_ms
from scrapy_ha.store import scripts
from scrapy_ha.store.hosts import url_host
from scrapy_ha.store.payloads import read_payloads
from scrapy_ha.store.sharding import shards_of
from scrapy_ha.store.wire import text

if TYPE_CHECKING:
    from scrapy_ha.keys import Keys
    from scrapy_ha.store.queue import RedisQueue

#: Fields of ``held`` (or members of ``waiting``) an ``HSCAN`` (``ZSCAN``) step looks at.
SCAN = 10_000


@dataclass
class Opened:
    """What an open did: the gates it opened (domain -> the server ms each would have
    opened at), and what waited behind them and was made due."""

    gates: dict[str, int] = field(default_factory=dict)
    #: back queues of their hosts parked in ``waiting``, made due
    queues: int = 0
    #: delayed entries that waited for their gates (deferred, or a 429's retry), made due
    entries: int = 0


async def closed_gates(queue: RedisQueue) -> dict[str, int]:
    """The gates closed now (domain -> the server ms it opens; of every shard, the latest),
    soonest first."""
    shards = [shard.keys for shard in shards_of(queue)]
    found = await gates_closed(queue.client, shards, await server_ms(queue.client))
    return dict(sorted(found.items(), key=lambda item: (item[1], item[0])))


async def gates_closed(client: Any, shards: list[Keys], now_ms: int) -> dict[str, int]:
    """The gates of *shards* closed at *now_ms* (domain -> the server ms it opens, the
    latest of the shards'; a time that is no finite number is open)."""
    found: dict[str, int] = {}
    for keys in shards:
        for domain, until in (await client.hgetall(keys.gates)).items():
            opens = _ms(until)
            if opens is not None and opens > now_ms:
                name = text(domain)
                found[name] = max(opens, found.get(name, 0))
    return found


async def open_gates(queue: RedisQueue, domains: list[str]) -> Opened:
    """Open the gates of *domains* in every shard, then make what waited behind them due.
    What waited for a domain whose gate is not closed is made due too: an open stopped part
    way (a connection lost after the gate was opened) is finished by running it again."""
    done = Opened()
    if not domains:  # (the script opens every gate when given none)
        return done
    script = scripts.Registered(queue.client, "gate_open")
    for shard in shards_of(queue):
        keys = shard.keys
        flat = await script(keys=[keys.gates, keys.gate_log], args=domains)
        for i in range(0, len(flat), 2):
            domain, until = text(flat[i]), int(flat[i + 1])
            done.gates[domain] = max(until, done.gates.get(domain, 0))
        done.queues += await _wake_queues(shard, set(domains))
        done.entries += await _due_entries(shard, set(domains))
    return done


async def _wake_queues(shard: RedisQueue, hosts: set[str]) -> int:
    """Make the back queues of *hosts* parked in ``waiting`` due now (``ZADD XX``: a queue
    the lease took back to ``ready`` meanwhile is not added again); the next lease of any
    worker moves them back to ``ready``."""
    client, key = shard.client, shard.keys.waiting
    now = await server_ms(client)
    match = "*:" + _glob(next(iter(hosts))) if len(hosts) == 1 else "*"
    qids = [
        qid
        async for qid, _ in client.zscan_iter(key, match=match, count=SCAN)
        if _host(qid) in hosts
    ]
    return await _due(client, key, qids, now)


async def _due_entries(shard: RedisQueue, domains: set[str]) -> int:
    """Make the delayed entries of *domains* that waited for their gates due now: those
    deferred for it (marked ``gate <domain>`` in ``held``) and the retries of a 429
    (``rate_limited``: their delay is the site's ``Retry-After``, as the gate's); a retry of
    another class keeps its backoff, and a revisit its time. The next sync of any worker
    promotes them."""
    client, keys = shard.client, shard.keys
    ids = [  # the delayed entries of these hosts (their restore record: "<score> <host>")
        text(entry_id)
        async for entry_id, record in client.hscan_iter(keys.delayed_score, count=SCAN)
        if text(record).partition(" ")[2] in domains
    ]
    chosen: list[str] = []
    for start in range(0, len(ids), BATCH):
        part = ids[start : start + BATCH]
        marks = await client.hmget(keys.held, part)
        retries = [i for i, mark in zip(part, marks, strict=True) if mark is None]
        chosen += [
            i for i, mark in zip(part, marks, strict=True) if text(mark or b"")[:5] == "gate "
        ]
        payloads = await read_payloads(client, keys, retries)
        chosen += [
            i
            for i, payload in zip(retries, payloads, strict=True)
            if describe(payload).last_class == "rate_limited"
        ]
    return await _due(client, keys.delayed, chosen, await server_ms(client))


async def _due(client: Any, key: str, members: list[Any], now: int) -> int:
    changed = 0
    for start in range(0, len(members), BATCH):
        mapping = dict.fromkeys(members[start : start + BATCH], now)
        changed += int(await client.zadd(key, mapping, xx=True, ch=True))
    return changed


def _host(qid: Any) -> str:
    """The host of a back queue's id (``<priority>:<host>``, ``<priority>s:<host>``)."""
    return text(qid).partition(":")[2]


def _glob(name: str) -> str:
    """*name* as a literal in a ``SCAN`` pattern (an IPv6 host's brackets included)."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", name)


def _ms(value: Any) -> int | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if number == number and abs(number) != float("inf") else None


def domain_of(text: str) -> str:
    """A domain as the back queues name their host: ``Shop.Example:8080``,
    ``https://shop.example/x`` and ``shop.example`` are one; ``::1`` is ``[::1]``."""
    url = text
    if "://" not in url:
        bare_ipv6 = url.count(":") > 1 and not url.startswith("[")
        url = f"http://[{url}]" if bare_ipv6 else f"http://{url}"
    host = url_host(url)
    if host == "-":
        return text
    try:  # as a spider's request has it (Bücher.example: xn--bcher-kva.example)
        return host.encode("idna").decode("ascii") if not host.isascii() else host
    except UnicodeError:
        return host
