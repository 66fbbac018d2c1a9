"""Pipelines of the tools' blocking clients: a Redis Cluster's take no script (redis-py's
``ClusterPipeline`` refuses ``EVALSHA`` and does not implement ``EVAL``), so its reads run
one command at a time (:class:`OneByOne`); the metrics exporter and
``scrapy_ha.stats.read_crawl_stats`` failed on every crawl of a cluster before."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import redis

from scrapy_ha.ops.unreadable import raise_first
from scrapy_ha.store.connection import REDIS_DOWN_ERRORS
from scrapy_ha.store.health import is_cluster

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["OneByOne", "pipeline_of"]


class OneByOne:
    """A pipeline's stand-in for a Redis Cluster's blocking client, whose pipelines take no
    script (redis-py refuses EVALSHA and EVAL in them): each command runs at once, in turn,
    and :meth:`execute` returns the replies, an error among them as a pipeline's
    ``execute(raise_on_error=False)`` keeps it."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._replies: list[Any] = []

    def __getattr__(self, name: str) -> Callable[..., None]:
        command = getattr(self._client, name)

        def queued(*args: Any, **kwargs: Any) -> None:
            try:
                self._replies.append(command(*args, **kwargs))
            except REDIS_DOWN_ERRORS:
                raise  # (CLUSTERDOWN, TRYAGAIN: Redis is away, as a pipeline would say)
            except redis.exceptions.ResponseError as exc:
                self._replies.append(exc)

        return queued

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        replies, self._replies = self._replies, []
        if raise_on_error:
            raise_first(replies)
        return replies


def pipeline_of(client: Any) -> Any:
    """A pipeline of the blocking *client* (:class:`OneByOne` for a Redis Cluster's)."""
    if is_cluster(client):
        return OneByOne(client)
    return client.pipeline(transaction=False)
