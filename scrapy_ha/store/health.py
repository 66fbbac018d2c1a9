"""What about the Redis a crawl runs on can lose the crawl: checked when a worker connects
(a WARNING per problem, once per process) and shown by ``scrapy-ha status``.

- **Eviction.** With ``maxmemory`` set, a ``maxmemory-policy`` other than ``noeviction``
  deletes keys when memory runs out: ``allkeys-*`` deletes queued requests, leases and
  fingerprints (requests are lost, or crawled again); ``volatile-*`` deletes the keys
  scrapy-ha gives a TTL (pagination checkpoints, a worker's lease grant) before their
  time. Under ``noeviction`` a full Redis refuses writes instead, and scrapy-ha keeps what
  it could not write and retries it: nothing is lost, the crawl waits. Without
  ``maxmemory`` (0) nothing is ever evicted, whatever the policy.
- **Persistence.** With neither AOF (``appendonly``) nor RDB snapshots (``save``), a
  restart of Redis empties it: the crawl is gone. With RDB snapshots alone (Redis's
  default), a crash takes the crawl back to the last snapshot: what was acked since is
  redone, and start requests stored since are lost, with every page only they lead to,
  unless the worker that stored them still runs: it keeps them until a snapshot has them
  (:mod:`scrapy_ha.scheduler.session.durable`; docs/scaling.md, "A restart from an older
  snapshot").
- **Version.** Redis older than 6.2 is not tested (the scripts use commands and Lua
  behaviour of 6.2 and later).

A check Redis does not allow (``CONFIG`` renamed by a managed service, an ACL user
without ``+config|get``) is skipped: it is not a problem of the crawl.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio

from scrapy_ha.store.wire import text as _text

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "MIN_VERSION",
    "info_or_nothing",
    "is_cluster",
    "over_maxmemory",
    "primaries_info",
    "primaries_info_sync",
    "redis_health",
    "warn_once",
]

logger = logging.getLogger(__name__)

#: The oldest Redis the test suite runs on; older servers lack commands the scripts use.
MIN_VERSION = (6, 2)
#: The one eviction policy that never deletes a key of the crawl.
SAFE_POLICY = "noeviction"


def is_cluster(client: Any) -> bool:
    return isinstance(client, redis.RedisCluster | redis.asyncio.RedisCluster)


#: What a node of a Redis Cluster that cannot be asked raises: unreachable, or refusing the
#: user (an ACL user is per node). Its shard's own commands say so; the others are read.
NODE_ERRORS = (redis.exceptions.RedisError, OSError)


async def primaries_info(client: Any, *section: str) -> dict[str, Any]:
    """``INFO`` of the server, or of each primary of a Redis Cluster by node name (None
    for one that could not be read): redis-py sends a server command to one node (its
    default), and a full or evicting primary holding a shard went unseen. A replica
    ignores ``maxmemory`` (``replica-ignore-maxmemory``): primaries alone refuse writes or
    evict."""
    if not is_cluster(client):
        return dict(await client.info(*section))
    found: dict[str, Any] = {}
    for node in await _primaries(client):
        found[node.name] = None
        with contextlib.suppress(*NODE_ERRORS):
            found[node.name] = await client.info(*section, target_nodes=node)
    return found


async def _primaries(client: Any) -> list[Any]:
    """The primaries of an asyncio cluster client (which learns its nodes at its first
    command: none before)."""
    with contextlib.suppress(*NODE_ERRORS):
        await client.initialize()
    return list(client.get_primaries())


def primaries_info_sync(client: Any, *section: str) -> dict[str, Any]:
    """:func:`primaries_info` of a blocking client (the metrics exporter's)."""
    if not is_cluster(client):
        return dict(client.info(*section))
    found: dict[str, Any] = {}
    for node in client.get_primaries():
        found[node.name] = None
        with contextlib.suppress(*NODE_ERRORS):
            found[node.name] = client.info(*section, target_nodes=node)
    return found


async def over_maxmemory(client: Any) -> list[str]:
    """The servers at or over their ``maxmemory`` (a Redis Cluster's primaries, by name),
    each with its figures: what an ``OutOfMemoryError`` came from."""
    if not is_cluster(client):
        infos = {"": await client.info("memory")}
    else:
        infos = await primaries_info(client, "memory")
    full = []
    for name, info in infos.items():
        used, most = int((info or {}).get("used_memory", 0)), int((info or {}).get("maxmemory", 0))
        if most and used >= most:
            where = f"the primary {name}, " if name else ""
            full.append(f"{where}used_memory {_size(used)} of maxmemory {_size(most)}")
    return full


def _size(n: int) -> str:
    """*n* bytes, in MB (in bytes under 1 MB: a maxmemory of 1 set to stop writes)."""
    return f"{n / 2**20:,.1f} MB" if n >= 2**20 else f"{n:,} bytes"


async def info_or_nothing(client: Any) -> dict[str, Any]:
    """Redis's ``INFO``, or an empty dict, after a ``PING``, if the ACL refuses ``INFO`` to
    this user: no start-up check then, and no back-pressure (docs/scaling.md). A QA run:
    every worker of such a user stopped at start, its first command refused."""
    try:
        return dict(await client.info())
    except redis.exceptions.NoPermissionError:
        await client.ping()
        return {}


async def redis_health(client: Any, info: dict[str, Any] | None = None) -> list[str]:
    """One sentence per problem of the Redis *client* talks to (none: an empty list), from
    its ``INFO`` (*info*, read now if not given).

    Each sentence names the setting of Redis and the fix. On a Redis Cluster each primary
    that answers is checked (its own ``INFO`` and ``save``), and a problem is said once."""
    facts: list[tuple[dict[str, Any], set[str] | None]] = []
    unread: list[str] = []
    if is_cluster(client):
        for node in await _primaries(client):
            try:
                node_info = await client.info(target_nodes=node)
            except NODE_ERRORS as exc:  # said: a full node must not pass for a healthy one
                unread.append(
                    f"the primary {node.name} could not be read ({exc}): its "
                    "memory and settings are not checked"
                )
                continue
            facts.append((node_info, await _config_get(client, "save", target_nodes=node)))
    else:
        if not info:  # (empty: INFO refused to this user at connect; not checked then)
            try:
                info = await client.info()
            except redis.exceptions.ResponseError:  # INFO not allowed to this user
                return []
        facts.append((info, await _config_get(client, "save")))
    problems: list[str] = unread
    for node_info, saves in facts:
        for problem in node_problems(node_info, saves):
            if problem not in problems:
                problems.append(problem)
    return problems


async def warn_once(client: Any, url: str, info: dict[str, Any] | None = None) -> list[str]:
    """Log each problem of the Redis at *url* at WARNING, the first time this process
    connects to it (its ``INFO``: *info*, read now if not given); return them (a check
    that fails is skipped, never fatal)."""
    if url in _WARNED:
        return []
    _WARNED.add(url)
    try:
        problems = await redis_health(client, info)
    except (redis.exceptions.RedisError, OSError) as exc:
        logger.debug("Could not check the Redis at %s: %s", url, exc)
        return []
    for problem in problems:
        logger.warning("Redis at %s: %s", url, problem)
    return problems


#: The Redis URLs this process has checked already: each is warned about once.
_WARNED: set[str] = set()


def node_problems(info: dict[str, Any], saves: set[str] | None) -> list[str]:
    """The problems one server's ``INFO`` shows; *saves*: its ``save`` settings, or None
    when they could not be read."""
    checks = (
        _version(info),
        _eviction(info),
        _full(info),
        _persistence(info, saves),
        _unguarded_replicas(info),
    )
    return [p for p in checks if p is not None]


#: How near ``maxmemory`` Redis refuses writes already: a command's own arguments count in
#: ``used_memory`` while Redis checks it, and a worker's round (its new requests) is tens of
#: kilobytes to megabytes. A QA run: a crawl 344 KB under its 200 MB ``maxmemory`` had every
#: round refused for a minute while ``status`` said ``redis ok``.
NEAR_FULL = (2**20, 100)  # 1 MB, or a hundredth of maxmemory if that is more


def _full(info: dict[str, Any]) -> str | None:
    """Redis at, over or within a write of its ``maxmemory``: it refuses every write that
    allocates past it, and the back-pressure mark itself (a key) cannot be written then (a
    QA run: a crawl frozen at 40 MB of a 20 MB maxmemory read as healthy)."""
    maxmemory = int(info.get("maxmemory", 0) or 0)
    used = int(info.get("used_memory", 0) or 0)
    margin = max(NEAR_FULL[0], maxmemory // NEAR_FULL[1])
    if not maxmemory or used < maxmemory - margin:
        return None
    if str(info.get("maxmemory_policy", SAFE_POLICY)).startswith("allkeys"):
        # it evicts keys, and takes the write (said by _eviction): near maxmemory is where
        # it stays (a QA run, allkeys-lru: "Redis refuses every write" beside writes taken)
        return None
    if used >= maxmemory:
        where, what = "at or over", "Redis refuses writes"
    else:
        where = f"within {(maxmemory - used) / 2**20:,.1f} MB of"
        what = "Redis refuses every write that would take it over (a worker's round)"
    return (
        f"used_memory {used / 2**20:,.1f} MB is {where} maxmemory "
        f"{maxmemory / 2**20:,.1f} MB: {what}, so workers can neither store, "
        f"lease nor acknowledge requests (nothing is lost; they retry); raise maxmemory "
        f"(CONFIG SET maxmemory), or free memory (scrapy-ha dlq purge, flush a finished crawl)"
    )


def _version(info: dict[str, Any]) -> str | None:
    text = str(info.get("redis_version", ""))
    try:
        version = tuple(int(part) for part in text.split(".")[:2])
    except ValueError:
        return None
    if version >= MIN_VERSION:
        return None
    return (
        f"Redis {text} is older than {'.'.join(map(str, MIN_VERSION))}, the oldest scrapy-ha "
        f"is tested on: upgrade Redis"
    )


#: How the problem of an evicting ``maxmemory-policy`` begins (:func:`evicts` reads it).
EVICTS = "maxmemory-policy is "


def evicts(problems: Iterable[str]) -> bool:
    """Do *problems* (:func:`redis_health`'s) say that a full Redis deletes keys?"""
    return any(problem.startswith(EVICTS) for problem in problems)


def _eviction(info: dict[str, Any]) -> str | None:
    policy = str(info.get("maxmemory_policy", SAFE_POLICY))
    maxmemory = int(info.get("maxmemory", 0) or 0)
    if policy == SAFE_POLICY or not maxmemory:
        return None
    if policy.startswith("allkeys"):
        what = "queued requests, leases and fingerprints (the crawl loses requests)"
    else:
        what = "pagination checkpoints and lease grants before they expire"
    return (
        f"{EVICTS}{policy} with maxmemory {maxmemory} bytes: when Redis is "
        f"full it deletes {what}; set maxmemory-policy noeviction (a full Redis then "
        f"refuses writes, and scrapy-ha retries them)"
    )


def _unguarded_replicas(info: dict[str, Any]) -> str | None:
    """A primary with replicas and no ``min-replicas-to-write`` in force (``INFO`` then has
    no ``min_slaves_good_slaves``; nor with ``min-replicas-max-lag 0``): a planned failover
    (``SENTINEL FAILOVER``) leaves it writable for some 10 s after its replica's promotion,
    and the workers' writes then are lost (a QA run: 528 pages twice, 6 dead letters lost;
    docs/scaling.md). A cluster's manual failover waits for the replica: not said of a
    cluster's nodes."""
    replicas = int(info.get("connected_slaves", 0) or 0)
    if info.get("role") != "master" or not replicas or "min_slaves_good_slaves" in info:
        return None
    if int(info.get("cluster_enabled", 0) or 0):
        return None
    return (
        f"a primary with {replicas} replica(s) and no min-replicas-to-write (or a "
        "min-replicas-max-lag of 0, which turns it off): a planned "
        "failover (SENTINEL FAILOVER) leaves it taking the workers' writes for some 10 s, "
        "lost when it follows the new primary; set min-replicas-to-write 1 and "
        "min-replicas-max-lag 10 on it and its replicas (writes then wait while no replica "
        "follows: run two replicas)"
    )


def _persistence(info: dict[str, Any], saves: set[str] | None) -> str | None:
    if int(info.get("aof_enabled", 0) or 0) or saves is None:
        return None
    snapshots = " ".join(sorted(saves - {""}))
    if not snapshots:
        return (
            'neither AOF nor RDB persistence is on (appendonly no, save ""): a restart of '
            "Redis loses the whole crawl; set appendonly yes (appendfsync everysec)"
        )
    return (
        f"AOF is off (appendonly no, RDB snapshots alone: save {snapshots}): a crash of "
        "Redis takes the crawl back to its last snapshot, minutes old or from before the "
        "crawl: pages acked since are crawled again, and start requests stored since are "
        "lost, with every page only they lead to, unless the worker that stored them still "
        "runs (it keeps them until a snapshot has them, an hour at most); set appendonly "
        "yes (appendfsync everysec)"
    )


async def _config_get(client: Any, name: str, **target: Any) -> set[str] | None:
    """The values of one setting; None when CONFIG GET is refused."""
    try:
        reply = await client.config_get(name, **target)
    except redis.exceptions.ResponseError:
        return None
    # (one server's, or one node's: CONFIG GET is sent to one primary at a time)
    return {_text(reply[name])} if isinstance(reply, dict) and name in reply else set()
