"""``scrapy-ha metrics``: serve the Prometheus exporter of :mod:`scrapy_ha.ops.metrics`
(``/metrics``) until SIGINT or SIGTERM."""

from __future__ import annotations

__all__ = ["serve", "sync_client"]

import logging
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from redis.backoff import NoBackoff
from redis.retry import Retry

from scrapy_ha.config.scheduler import key_prefix
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.ops.metrics import CrawlCollector
from scrapy_ha.store.connection import display_url, sync_redis_from_settings

if TYPE_CHECKING:
    import argparse

    from scrapy.settings import BaseSettings


def sync_client(settings: BaseSettings, *, timeout: float) -> Any:
    """A blocking Redis client of the crawl's Redis, made the way every scrapy-ha tool makes
    one (any URL form: TLS, Sentinel, Cluster...), whose every call gives up after *timeout*
    seconds and is never retried: a scrape must answer, not wait for Redis."""
    return sync_redis_from_settings(
        settings, connect_timeout=timeout, socket_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )


def serve(args: argparse.Namespace, settings: BaseSettings) -> int:
    """Serve ``/metrics`` until SIGINT or SIGTERM; 2 if the port cannot be bound."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError:
        raise ConfigError(
            "scrapy-ha metrics needs prometheus-client: pip install prometheus-client"
        ) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    prefix = args.prefix or key_prefix(settings)
    if args.redis_url:
        settings.set("REDIS_URL", args.redis_url, priority="cmdline")
    try:
        client = sync_client(settings, timeout=args.timeout)
    except ConfigError:
        raise  # names the setting and the fix already
    except ValueError as exc:  # redis-py cannot parse the URL
        raise ConfigError(f"bad Redis URL {display_url(settings)}: {exc}") from None
    registry = CollectorRegistry(auto_describe=False)
    where = display_url(settings)
    collector = CrawlCollector(
        client, prefix, discovery_ttl=args.rescan, where=where, timeout=args.timeout
    )
    registry.register(collector)
    try:
        server, _ = start_http_server(args.port, addr=args.addr, registry=registry)
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {args.addr}:{args.port} ({exc}): pick another --port or --addr"
        ) from None
    print(
        f"serving http://{args.addr}:{server.server_port}/metrics for the crawls under "
        f"{prefix}:* at {display_url(settings)}",
        flush=True,
    )
    _wait_for_signal()
    server.shutdown()
    client.close()
    return 0


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    print("stopped", file=sys.stderr)
