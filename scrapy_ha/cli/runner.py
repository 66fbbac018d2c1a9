"""How a parsed ``scrapy-ha`` command runs: its settings, its Redis, its crawl.

Redis is found from ``--redis-url`` (before or after the subcommand), else ``$REDIS_URL``,
else the Scrapy project's settings (``REDIS_URL``, ``REDIS_PARAMS``... when run inside a
project), else ``redis://localhost:6379/0``. The settings of a command on one spider are
those its workers have: the project's, the spider's ``custom_settings``, the add-ons'
(:mod:`scrapy_ha.cli.project`). A command on a crawl that is not in Redis fails with "no
such crawl" (exit code 1), unless it may make one and was told to (``--create``).
Outside any project, a command that reads only settings runs without importing Scrapy
(:data:`~scrapy_ha.cli.project.SETTINGS_ONLY`, :mod:`scrapy_ha.config.bare`).
"""

from __future__ import annotations

__all__ = ["run"]

import asyncio
import contextlib
import functools
import os
import sys
from typing import TYPE_CHECKING, Any, TypeVar

import redis.exceptions

from scrapy_ha.cli.items_start import StoppedWaiting, consumes, wait_for_redis
from scrapy_ha.cli.options import REDIS_URL_ENV
from scrapy_ha.cli.project import settings_only, worker_view
from scrapy_ha.codec.log_masking import install_log_masking, masked_output
from scrapy_ha.config.bare import BareSettings
from scrapy_ha.config.continuous import dupefilter_ttl
from scrapy_ha.config.memory import MemoryConfig
from scrapy_ha.config.scheduler import (
    DEFAULT_CONNECT_TIMEOUT,
    key_prefix,
    queue_order,
    start_queue_order,
)
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.ops.filter_layout import borrow_layout, check_room
from scrapy_ha.ops.shards import crawl_queue, stored_order
from scrapy_ha.ops.unreadable import CrawlUnreadable, explain
from scrapy_ha.store.asking import unsettled
from scrapy_ha.store.auth_hint import refused_login
from scrapy_ha.store.bloom import BloomMetaError
from scrapy_ha.store.claims import claim_kind, crawl_dupefilter, dupefilter_kind
from scrapy_ha.store.connection import (
    REDIS_DOWN_ERRORS,
    RedisDown,
    RedisUnavailable,
    display_url,
    redis_from_settings,
    untrusted_certificate,
)
from scrapy_ha.store.long_lived import long_lived
from scrapy_ha.store.sharding import check_shard_count, set_dupefilter, shard_setting
from scrapy_ha.store.state import CheckpointStore
from scrapy_ha.store.tls_hint import tls_hint
from scrapy_ha.store.url import RedisConfigError

if TYPE_CHECKING:
    import argparse

    from scrapy.settings import BaseSettings, Settings

    from scrapy_ha.cli.common import Command
    from scrapy_ha.store.queue import RedisQueue


#: Redis going away during a command (not any OSError: a closed pipe to `head` is not),
#: or a Redis Cluster losing a node that serves the crawl's keys (down, or re-electing).
REDIS_GONE = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterError,
)


def run(args: argparse.Namespace) -> int:
    """Run the parsed command *args*, masked; errors the user can fix exit with code 2."""
    install_log_masking()
    with masked_output():
        try:
            if args.command == "metrics":  # a server of its own, not a command on one crawl
                return int(args.func.load()(args, settings(args)))
            if args.command == "items":  # the project's pipelines may need Twisted's reactor
                from scrapy_ha.cli.items import in_loop

                return in_loop(args, _run(args))
            return asyncio.run(_run(args))
        except (RedisUnavailable, RedisConfigError, ConfigError, CrawlUnreadable) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except StoppedWaiting as exc:  # (the item consumer's wait for Redis)
            print(f"interrupted by {exc}", file=sys.stderr)
            return exc.code


def settings(args: argparse.Namespace) -> Settings:
    """The project's settings (Scrapy's defaults outside a project), the Redis URL given
    on the command line or in ``$REDIS_URL`` first."""
    from scrapy.utils.project import get_project_settings

    try:  # (outside a project: Scrapy's defaults)
        found = get_project_settings()
    except Exception as exc:  # noqa: BLE001 - a settings module may raise anything
        # (before: Scrapy's defaults in silence, and a Redis at localhost named instead)
        module = os.environ.get("SCRAPY_SETTINGS_MODULE") or "named by scrapy.cfg"
        raise ConfigError(
            f"the project's settings ({module}) cannot be read: {type(exc).__name__}: {exc}"
            " (run scrapy-ha where `scrapy list` works, or outside the project with "
            "--redis-url)"
        ) from None
    for name, value in getattr(args, "set", None) or ():  # (``items -s``)
        found.set(name, value, priority="cmdline")
    return _url_given(args, found)


#: Settings of either kind (Scrapy's, or scrapy_ha.config.bare's standing for them)
S = TypeVar("S", bound="BaseSettings")


def _url_given(args: argparse.Namespace, found: S) -> S:
    url = args.redis_url or os.environ.get(REDIS_URL_ENV)
    if url:
        found.set("REDIS_URL", url, priority="cmdline")
    return found


async def _run(args: argparse.Namespace) -> int:
    if settings_only(args):  # (Scrapy not imported: scrapy_ha.config.bare)
        config, args.worker_view = _url_given(args, BareSettings.of()), None
    else:
        view = worker_view(settings(args), args.spider)
        args.worker_view = view  # for push: the worker's fingerprints, shards and codec
        config = view.crawler.settings
    prefix = args.prefix or key_prefix(config)
    url = display_url(config)
    args.where = url  # (the dashboard names it when Redis goes away)
    client = await _reached(args, config, url)
    try:
        try:
            return await _on_crawl(client, prefix, args, config, url)
        except redis.exceptions.NoPermissionError as exc:  # (a QA run: a traceback)
            raise ConfigError(
                f"Redis at {url} refused this user a command or a key ({exc}): give a user whose "
                "ACL allows scrapy-ha's commands and the crawl's keys (docs/scaling.md)"
            ) from None
        except REDIS_GONE as exc:  # went away (shut down, stopped) during the command
            if unsettled(exc):
                raise RedisUnavailable(
                    f"Redis at {url} answered TRYAGAIN or redirected the command until "
                    "redis-py gave up (ClusterError: TTL exhausted): a slot of the crawl is "
                    "migrating between nodes (a reshard, a rebalance), or a failover is under "
                    "way; what it had done stands: run it again once it has ended"
                ) from None
            raise RedisUnavailable(
                f"Redis at {url} went away during the command ({_sentence(exc, url)}): what "
                "it had done stands; run it again once Redis is back"
            ) from None
    finally:
        with contextlib.suppress(*REDIS_DOWN_ERRORS):
            await client.aclose()


async def _on_crawl(
    client: Any, prefix: str, args: argparse.Namespace, config: BaseSettings, url: str
) -> int:
    """Run the command on its crawl; a key of the crawl of another type than scrapy-ha
    writes is named (``<key> holds a <type>``: :class:`CrawlUnreadable`), not a traceback,
    from the first read of the crawl (its shard count) on, and so is a Bloom filter's meta
    hash scrapy-ha cannot have written."""
    func: Command = args.func.load()
    try:
        projects = args.shards is None and config.get("HA_SHARDS") is not None
        given = _shards_given(args, config)
        order = _push_order(args) if func.__name__ == "push" else ("fifo", "")
        queue = await crawl_queue(
            client, prefix, args.spider, given, projects=projects, order=order
        )
        if args.spider and not await _there_or_made(queue, args, url):
            return 1
        if func.__name__ == "push":
            if args.worker_view.caveat and (stored := await stored_order(queue)):
                queue = await crawl_queue(  # not the workers' settings: their queues' order
                    client, prefix, args.spider, given, projects=projects, order=stored
                )
            await _prepare_push(queue, args, config)
        elif getattr(args, "create", False) or getattr(args, "declare", False):
            # the first writer of a crawl stores its shard count, as a worker does (a QA
            # run: `items --shards 4 --declare` stored none: `status` found no crawl, and
            # workers of one shard were taken, their items in a stream no sink read)
            await check_shard_count(queue)
        return await func(queue, args)
    except (redis.exceptions.ResponseError, BloomMetaError) as exc:
        if not args.spider or not _unreadable(exc):
            raise
        raise await explain(client, prefix, args.spider, exc) from None


async def _reached(args: argparse.Namespace, config: BaseSettings, url: str) -> Any:
    """A client of the Redis at *url* that answered; the item consumer waits for it
    (:mod:`.items_start`), every other command fails at once."""
    reach = functools.partial(_client_reached, config, url)
    if consumes(args):
        return await wait_for_redis(config, url, reach)
    return await reach(DEFAULT_CONNECT_TIMEOUT)


async def _client_reached(config: BaseSettings, url: str, timeout: float) -> Any:
    """A new client of the Redis at *url* that answered PING within *timeout* (a client
    per attempt: a Sentinel or cluster client that failed at its first command starts
    afresh), or :func:`reachable`'s error (:class:`RedisDown` while it may come back)."""
    try:
        # (the dashboard and `watch` keep it for hours: across a restart of Redis)
        client = long_lived(redis_from_settings(config, connect_timeout=timeout))
    except RedisConfigError:
        raise  # names the URL and the fix already
    except ValueError as exc:  # redis-py cannot parse the URL
        raise ConfigError(
            f"bad Redis URL {url}: {exc} (give --redis-url or {REDIS_URL_ENV} as "
            f"redis://[:password@]host:port/db)"
        ) from None
    try:
        await reachable(client, url, timeout)
    except BaseException:
        with contextlib.suppress(*REDIS_DOWN_ERRORS):
            await client.aclose()
        raise
    return client


def _unreadable(exc: Exception) -> bool:
    return isinstance(exc, BloomMetaError) or "WRONGTYPE" in str(exc)


def _push_order(args: argparse.Namespace) -> tuple[str, str]:
    """The order within a priority a worker of the spider places its new requests in (its
    settings as ``push`` reads them): a request pushed into a LIFO crawl goes to the head
    of its back queue, as a worker's own new request does, not to its tail."""
    settings = args.worker_view.crawler.settings
    return queue_order(settings), start_queue_order(settings)


async def _prepare_push(queue: RedisQueue, args: argparse.Namespace, config: BaseSettings) -> None:
    """The first writer of a crawl stores its shard count; ``push`` takes the crawl's
    dupefilter (its claim's kind) and claims it if the crawl has none. Settings of another
    kind than the claim's are not the workers': a Bloom filter a shard lacks is then made
    as another shard's was (:mod:`scrapy_ha.ops.filter_layout`)."""
    await check_shard_count(queue)
    local = MemoryConfig.from_settings(config), dupefilter_ttl(config)
    memory, ttl = await crawl_dupefilter(queue, *local)
    fix = OPERATOR_FIX.format(spider=args.spider, key=queue.keys.filter_kind)
    await set_dupefilter(queue, memory, ttl, claim=False, fix=fix, warn=False)  # claimed if pushed
    crawl = dupefilter_kind(memory, ttl)
    await borrow_layout(queue, local=dupefilter_kind(*local), crawl=crawl)
    if note := await check_room(queue):  # a new filter Redis has room for, as a worker's
        print(f"note: {note}", file=sys.stderr)
    args.claim_kind = functools.partial(claim_kind, queue, memory, ttl)
    args.dupefilter = memory, ttl  # a Bloom filter's workers fingerprint by 16 bytes


#: How a refused operator's command ends: never `flush` (it would delete the crawl).
OPERATOR_FIX = (
    "or run the command in the crawl's Scrapy project (its directory, or "
    "SCRAPY_SETTINGS_MODULE), whose settings its workers have: the crawl of {spider} has no "
    "claim of its kind ({key}) to read it from"
)


async def reachable(client: Any, url: str, timeout: float = DEFAULT_CONNECT_TIMEOUT) -> None:
    """PING Redis, or a RedisUnavailable that says what to do, phrased for a shell
    (:class:`RedisDown` when it did not answer: it may, later)."""
    try:
        async with asyncio.timeout(timeout):
            await client.ping()
    except redis.exceptions.AuthenticationError as exc:
        raise RedisUnavailable(
            f"{refused_login(url, _sentence(exc, url))}: give the user name and password in "
            f"--redis-url or ${REDIS_URL_ENV}"
        ) from None
    except redis.exceptions.InvalidResponse as exc:
        raise RedisUnavailable(
            f"{url} does not answer as a Redis server does ({_sentence(exc, url)}): check the "
            f"host and port of --redis-url or ${REDIS_URL_ENV}"
        ) from None
    except REDIS_DOWN_ERRORS as exc:
        ca = "the project's REDIS_TLS_CA_FILE (outside a project, the URL's ?ssl_ca_certs=PATH)"
        untrusted = untrusted_certificate(exc, url, ca)
        if untrusted:
            raise RedisUnavailable(untrusted) from None
        check, give = "is redis-server running there?", "its address"
        if type(exc).__name__ == "MasterNotFoundError":  # (redis-py's, sync or asyncio: a QA run)
            check = "do the sentinels there name a primary for the service (a failover under way)?"
        elif "+cluster" in url.partition("://")[0]:  # (its nodes down, or failing over)
            check = (
                "are the cluster's nodes named there running? A replica taking over answers "
                "within the cluster's cluster-node-timeout; a node named there that does not "
                "answer is passed over for one that does."
            )
            give = "the address of more of its nodes"
        reason = f"{_sentence(exc, url)}{tls_hint(exc, url)}"
        raise RedisDown(
            f"cannot reach Redis at {url} within {timeout:g} s ({reason}): {check} Give "
            f"{give} with --redis-url or ${REDIS_URL_ENV}",
            reason,
        ) from None
    except redis.exceptions.NoPermissionError as exc:  # the ACL denies the user SELECT or PING
        raise RedisUnavailable(
            f"Redis at {url} refused a command to the user of the URL ({_sentence(exc, url)}): "
            f"give a user its ACL allows (ACL SETUSER ... +@all, or the commands named) in "
            f"--redis-url or ${REDIS_URL_ENV}"
        ) from None
    except (
        redis.exceptions.ResponseError
    ) as exc:  # SELECT of a database it has not (not a busy or cluster state: above)
        if "unknown command 'SENTINEL'" in str(exc):
            raise RedisUnavailable(
                f"{url} is no Sentinel ({_sentence(exc, url)}): a redis+sentinel:// URL names "
                f"Sentinels (port 26379 by default); give redis://host:port/db for a Redis "
                f"itself in --redis-url or ${REDIS_URL_ENV}"
            ) from None
        db = client.connection_pool.connection_kwargs.get("db", 0)
        raise RedisUnavailable(
            f"Redis at {url} refused the connection to database {db} ({_sentence(exc, url)}): "
            f"give a database it has (CONFIG GET databases: 16 by default, 0 to 15) in "
            f"--redis-url or ${REDIS_URL_ENV}"
        ) from None


def _sentence(exc: BaseException, url: str) -> str:
    """An error as a clause inside a sentence: its type and message, without the final
    period redis-py ends some with, and never a URL with its password."""
    text = (str(exc) or "timed out").strip().rstrip(".")
    if "@" in text:
        text = f"error connecting to {url}"
    return f"{type(exc).__name__}: {text}"


#: ``items`` actions that make nothing in a crawl: ``--create`` goes with none of them.
_MAKE_NOTHING = ("aside", "retry_aside", "undeclare")


async def _there_or_made(queue: RedisQueue, args: argparse.Namespace, url: str) -> bool:
    """Whether the command may go on: its crawl is in Redis, or it was told to make it."""
    if getattr(args, "create", False) or getattr(args, "declare", False):
        return True  # told to make it (``items --declare`` makes its sink's group)
    if await crawl_exists(queue):
        return True
    fix = "check the spider name, --prefix and --redis-url"
    if args.create_allowed and not any(getattr(args, a, False) for a in _MAKE_NOTHING):
        fix += "; to start a new crawl, pass --create"
    print(
        f"error: no such crawl: no key of spider {queue.keys.spider!r} under "
        f"{queue.keys.prefix}:{{{queue.keys.spider}}}:* in {url} ({fix})",
        file=sys.stderr,
    )
    return False


async def crawl_exists(queue: RedisQueue) -> bool:
    """Whether any key of the crawl (checkpoints included) is in Redis."""
    if await queue.exists():
        return True
    return await CheckpointStore(queue.client, queue.keys).exists()


def _shards_given(args: argparse.Namespace, config: BaseSettings) -> int | None:
    """``--shards``, else the project's ``HA_SHARDS`` if set (None: read from Redis)."""
    if args.shards is not None:
        config.set("HA_SHARDS", args.shards, priority="cmdline")
    return shard_setting(config) if config.get("HA_SHARDS") is not None else None
