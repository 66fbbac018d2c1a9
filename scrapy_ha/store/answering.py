"""A Redis Cluster client that asks its startup nodes for the cluster's layout only once
one of them answers.

redis-py learns a cluster's slots from the first of its startup nodes that answers
``CLUSTER SLOTS``, trying them one after the other (in a random order in recent
versions, in the order given in older ones), each within the whole socket timeout. One
node that hangs (its process stopped, its host gone without a reset, a network that drops
packets) took that whole timeout: with three nodes of a cluster in the URL and one frozen,
a ``scrapy-ha`` command failed one time in three ("cannot reach Redis ... within 5 s")
after its replica had taken over, and a worker's start attempt too. The asyncio client
(:func:`ask_answering_nodes`) now PINGs its startup nodes first, all at once, each within
a share of the connect timeout (as the sentinels are asked: ``url._sentinel_client``), and
its lookup asks those that answered by the time the first did; the blocking client
(:func:`answering_startup_nodes`) is given the first node that answers (a thread each).
When none answers, or the lookup of those that did fails (a node that answers PING and
not the lookup: just restarted, cut off from the others, not of a cluster), every node is
asked in turn, as before, and redis-py's error says what they did. The lookup learns
every node of the cluster from the node it asked.
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

import redis
import redis.asyncio.cluster
import redis.cluster

__all__ = ["answering_startup_nodes", "ask_answering_nodes", "blocking_cluster"]

#: Errors of a node that does not answer (or not in time); any other error is an answer.
_SILENT = (
    OSError,
    asyncio.TimeoutError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
)


def ask_answering_nodes(client: Any) -> Any:
    """*client* (a cluster client), whose layout lookups ask only the startup nodes that
    answer a PING, if it is an asyncio one (see :func:`answering_startup_nodes`); returned."""
    manager = client.nodes_manager
    base = type(manager)
    if not isinstance(manager, redis.asyncio.cluster.NodesManager):
        return client
    if not getattr(base, "_asks_answering", False):
        if base not in _ANSWERING:  # (made once a class; __slots__: see asking.follow_asks)
            own = {"__slots__": (), "_asks_answering": True, "initialize": _initialize(base)}
            _ANSWERING[base] = type(f"Answering{base.__name__}", (base,), own)
        manager.__class__ = _ANSWERING[base]
    return client


#: The answering class of each nodes manager's class.
_ANSWERING: dict[type, type] = {}


def _initialize(base: type) -> Any:
    """*base*'s ``initialize``, after a PING of the startup nodes."""
    known = base.initialize  # type: ignore[attr-defined]

    async def initialize(self: Any, *args: Any, **kwargs: Any) -> Any:
        every = self.startup_nodes
        silent = await _silent(every, self.connection_kwargs)
        if not silent or len(silent) == len(every):  # (none silent, or none answered:
            return await known(self, *args, **kwargs)  # redis-py says what they did)
        self.startup_nodes = {name: node for name, node in every.items() if name not in silent}
        try:
            found = await known(self, *args, **kwargs)
        except Exception:  # (a node that answers PING, not the lookup: one just restarted,
            self.startup_nodes = every  # or cut off from the others): every one, in turn
            return await known(self, *args, **kwargs)
        except BaseException:
            self.startup_nodes = every
            raise
        if not getattr(self, "_dynamic_startup_nodes", True):
            self.startup_nodes = every  # (a lookup that holds to its startup nodes)
        else:
            await _forget(self, [every[name] for name in silent])
        return found

    return initialize


async def _forget(manager: Any, dropped: list[Any]) -> None:
    """Close the connections of the startup nodes *dropped* from *manager*'s lookups (the
    lookup made its startup nodes those it found), unless the manager still holds them
    (older redis-py makes the found nodes its startup nodes, the same objects)."""
    kept = {id(node) for node in (*manager.nodes_cache.values(), *manager.startup_nodes.values())}
    for node in dropped:
        if id(node) not in kept:
            await node.disconnect()


def _share(nodes: dict[str, Any], kwargs: dict[str, Any]) -> float:
    """Seconds each node is given: the connect timeout over one more than the nodes."""
    timeout = kwargs.get("socket_connect_timeout") or kwargs.get("socket_timeout") or 5.0
    return float(timeout) / (len(nodes) + 1)


async def _silent(nodes: dict[str, Any], kwargs: dict[str, Any]) -> set[str]:
    """The names of *nodes* that did not answer a PING within their share (none with a
    single node: there is no other to ask)."""
    if len(nodes) < 2:
        return set()
    share = _share(nodes, kwargs)
    asked = {
        asyncio.ensure_future(_answers(node.host, node.port, kwargs, share)): name
        for name, node in nodes.items()
    }
    answered: set[str] = set()
    pending = set(asked)
    while pending and not answered:  # (until one answers: the lookup needs one)
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        answered |= {asked[task] for task in done if task.result()}
    for task in pending:  # (slower than the first to answer: asked last, if at all)
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return set(nodes) - answered


async def _answers(host: str, port: int, kwargs: dict[str, Any], share: float) -> bool:
    """Whether the node answers within *share* seconds, on a connection of its own (the
    client's are its nodes': a PING given up halfway would leave its reply for the next
    command)."""
    timeouts = {"socket_timeout": share, "socket_connect_timeout": share}
    node = redis.asyncio.cluster.ClusterNode(host, port, **(kwargs | timeouts))
    connection: Any = node.connection_class(**node.connection_kwargs)  # (as a node makes one)
    try:
        async with asyncio.timeout(share):
            await connection.connect()
            await connection.send_command("PING")
            await connection.read_response()
    except _SILENT:
        return False
    except Exception:  # noqa: BLE001 - an answer (refused login, a node not of a cluster):
        return True  # the lookup that follows says what it is
    finally:
        await connection.disconnect()
    return True


def blocking_cluster(cls: Any, nodes: tuple[tuple[str, int], ...], kwargs: dict[str, Any]) -> Any:
    """A blocking cluster client of *cls* (its connection *kwargs*), made with the startup
    node of *nodes* that answered a PING first (:func:`answering_startup_nodes`); with
    every one, in turn, if that one's lookup failed (it answers PING, not the lookup: just
    restarted, or cut off from the others) or the client keeps its startup nodes
    (``dynamic_startup_nodes=False``)."""
    node: Any = redis.cluster.ClusterNode  # (untyped in redis-py)
    every = [node(host, port) for host, port in nodes]
    if kwargs.get("dynamic_startup_nodes", True):
        with contextlib.suppress(redis.exceptions.RedisClusterException):
            return cls(startup_nodes=answering_startup_nodes(every, kwargs), **kwargs)
    return cls(startup_nodes=every, **kwargs)


def answering_startup_nodes(nodes: list[Any], kwargs: dict[str, Any]) -> list[Any]:
    """Of *nodes* (a blocking client's, its connection *kwargs*), the first that answers
    a PING within a share of the connect timeout, all asked at once (a thread each), or
    every one when none does. (The blocking client looks the layout up as it is made; its
    later lookups, after a failover, ask the nodes that lookup found.)"""
    if len(nodes) < 2:
        return nodes
    share = _share(dict.fromkeys(n.name for n in nodes), kwargs)
    pool = ThreadPoolExecutor(len(nodes), thread_name_prefix="scrapy-ha-cluster-ping")
    asked = {pool.submit(_answers_now, n.host, n.port, kwargs, share): n for n in nodes}
    try:  # (a node that hangs: its thread ends within its share, not waited for here)
        answering = next((asked[f] for f in as_completed(asked) if f.result()), None)
    finally:
        pool.shutdown(wait=False)
    return nodes if answering is None else [answering]


def _answers_now(host: str, port: int, kwargs: dict[str, Any], share: float) -> bool:
    """:func:`_answers` for the blocking client."""
    cleanup: Any = redis.cluster.cleanup_kwargs  # (untyped in redis-py)
    probe_kwargs = cleanup(**kwargs)  # (a server's arguments only)
    probe_kwargs |= {"socket_timeout": share, "socket_connect_timeout": share, "retry": None}
    probe = redis.Redis(host=host, port=port, **probe_kwargs)
    try:
        probe.ping()
    except _SILENT:
        return False
    except Exception:  # noqa: BLE001 - an answer: the lookup that follows says what it is
        return True
    finally:
        probe.close()
    return True
