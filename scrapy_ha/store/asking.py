"""A Redis Cluster client that follows an ``ASK`` redirect to a node serving no slot yet.

An operator who adds a node to a cluster moves slots to it (``redis-cli --cluster
reshard``, ``rebalance --cluster-use-empty-masters``): while a slot of the crawl migrates,
the old owner answers ``ASK <slot> <new node>`` for its keys already moved (and for keys
that do not exist). redis-py (8.1 and before, redis/redis-py#4015) looks the node of an
``ASK`` up among the nodes ``CLUSTER SLOTS`` named, where a node with no slot is not: the
command failed with ``AttributeError`` ('NoneType' object has no attribute
'execute_command'), not a Redis error, and a worker logged a traceback every second of the
migration. :func:`follow_asks` makes the client's node lookup add such a node, as
redis-py already does for the node of a ``MOVED`` reply. And as long as the slot's keys
are on both nodes, a command of several keys is refused (``TRYAGAIN``): :func:`exists_any`
asks one key a command, so that the CLI finds the crawl meanwhile, and :func:`outage`
says that a slot moves, not that Redis is unreachable, when redis-py gave up retrying them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import redis.asyncio.cluster
import redis.cluster

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["exists_any", "follow_asks", "outage", "unsettled"]


def follow_asks(client: Any) -> Any:
    """*client* (a cluster client, asyncio or blocking), its node lookup by name
    completed with the nodes ``ASK`` redirects name; returned."""
    manager = client.nodes_manager
    base = type(manager)
    if not getattr(base, "_follows_asks", False):  # (a class of the same layout: the
        # asyncio one has __slots__, so the method cannot be set on the object)
        if base not in _ASKING:  # (made once a class, not once a client)
            own = {"__slots__": (), "_follows_asks": True, "get_node": _get_node(base.get_node)}
            _ASKING[base] = type(f"Asking{base.__name__}", (base,), own)
        manager.__class__ = _ASKING[base]
    return client


#: The asking class of each nodes manager's class.
_ASKING: dict[type, type] = {}


def _get_node(known: Any) -> Any:
    """*known* (``NodesManager.get_node``), a lookup by name completed with a new node."""

    def get_node(self: Any, host: Any = None, port: Any = None, node_name: Any = None) -> Any:
        node = known(self, host, port, node_name)
        if node is None and node_name and host is None and port is None:
            node = _new_primary(self, node_name)
        return node

    return get_node


def _new_primary(manager: Any, name: str) -> Any:
    """The node *name* (``host:port``) added to *manager*'s nodes as redis-py adds a
    ``MOVED`` reply's (``NodesManager.move_slot``); None for a name of another form."""
    host, _, port = name.rpartition(":")
    if not host or not port.isdigit():
        return None
    if isinstance(manager, redis.asyncio.cluster.NodesManager):
        new = redis.asyncio.cluster.ClusterNode(
            host, int(port), redis.cluster.PRIMARY, **manager.connection_kwargs
        )
        manager.set_nodes(manager.nodes_cache, {new.name: new})
        return new
    node: Any = redis.cluster.ClusterNode  # (untyped in redis-py)
    made = node(host, int(port), redis.cluster.PRIMARY)
    manager.nodes_cache[made.name] = made  # (its connection is made at its first use)
    return made


async def exists_any(client: Any, keys: Iterable[str]) -> bool:
    """Whether any of *keys* (of one hash tag) is in Redis: an ``EXISTS`` per key, in one
    pipeline, where one ``EXISTS`` of them all is refused while their slot migrates."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.exists(key)
    return any(await pipe.execute())


def unsettled(exc: BaseException) -> bool:
    """Whether redis-py gave up following a cluster's redirections and ``TRYAGAIN`` replies
    (a command of several keys on a migrating slot gets TRYAGAIN until the slot has moved,
    and a failover redirects until it has ended)."""
    return isinstance(exc, redis.exceptions.ClusterError) and "TTL exhausted" in str(exc)


def outage(exc: BaseException) -> str:
    """What a worker's WARNING says of a Redis it could not use in a round."""
    if unsettled(exc):
        return (
            "refused the crawl's commands until redis-py gave up (ClusterError: TTL exhausted): "
            "a slot of the crawl is migrating between nodes, or a failover is under way"
        )
    return f"unreachable ({type(exc).__name__}: {exc})"
