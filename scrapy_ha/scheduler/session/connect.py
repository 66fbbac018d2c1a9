"""Opening a crawl's queue in Redis: connect, check the server, flush when asked, and say
what this worker joins (and, once its start requests are in, how many the crawl had seen
already). A setting refused here fails before anything is written. A Redis that does not
answer yet is waited for (:class:`~scrapy_ha.store.start_wait.StartWait`), as a running
worker waits for it."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import redis
import scrapy

from scrapy_ha._version import __version__
from scrapy_ha.config.validate import ConfigError, start_key
from scrapy_ha.deadletters.marks import spread_declaration
from scrapy_ha.keys import Keys
from scrapy_ha.scheduler import engine
from scrapy_ha.scheduler.session.moved import name_left_queue
from scrapy_ha.scheduler.session.start_urls import check_start_key
from scrapy_ha.scheduler.session.unfed import say_unfed_sinks
from scrapy_ha.spiders import RedisSpiderMixin
from scrapy_ha.store.bloom import first_layer_room
from scrapy_ha.store.claims import claim_kind
from scrapy_ha.store.connection import (
    REDIS_DOWN_ERRORS,
    RedisUnavailable,
    check_reachable,
    redis_from_settings,
    start_error,
)
from scrapy_ha.store.health import warn_once
from scrapy_ha.store.join import join_crawl, leave_crawl
from scrapy_ha.store.runs import open_run
from scrapy_ha.store.sharding import (
    make_queue,
    queue_in_redis,
    set_dupefilter,
    shard_setting,
    shards_of,
)
from scrapy_ha.store.start_wait import StartWait

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

    from scrapy_ha.config.scheduler import SchedulerConfig
    from scrapy_ha.scheduler.outbox import Outbox
    from scrapy_ha.store.queue import RedisQueue
    from scrapy_ha.store.runs import Run
    from scrapy_ha.store.start_wait import Halt
    from scrapy_ha.store.wire import Counts, NewEntry, SyncResult

logger = logging.getLogger(__name__)

#: Errors that mean the worker could not reach, or use, its Redis at start.
START_FAILURES = (RedisUnavailable, *REDIS_DOWN_ERRORS, redis.exceptions.RedisError)


def start_wait(config: SchedulerConfig, redis_url: str, halt: Halt) -> StartWait:
    """The worker's wait for Redis at start; its WARNINGs on this module's logger, where
    they always were."""
    return StartWait(config, redis_url, halt, log=logger)


def start_failure(exc: Exception, redis_url: str) -> str:
    """Why the worker cannot start (an error of :data:`START_FAILURES`, a setting refused,
    or a ``REDIS_URL`` redis-py cannot parse), as its one ERROR line."""
    if isinstance(exc, START_FAILURES):
        return start_error(exc, redis_url)
    if isinstance(exc, ConfigError):
        return f"scrapy-ha cannot start: {exc}"
    return f"scrapy-ha cannot start: {exc} (check REDIS_URL)"


async def _reachable_client(
    settings: BaseSettings, config: SchedulerConfig, redis_url: str
) -> tuple[Any, dict[str, Any]]:
    """A new client of a Redis that answered, and its ``INFO`` (a client per attempt: a
    Sentinel or cluster client that failed at its first command starts afresh)."""
    client = redis_from_settings(settings, connect_timeout=config.connect_timeout)
    try:
        return client, await check_reachable(client, redis_url, config.connect_timeout)
    except BaseException:
        await client.aclose()
        raise


async def open_queue(
    crawler: Crawler, config: SchedulerConfig, spider: Spider, wait: StartWait, sender: str = ""
) -> tuple[RedisQueue, dict[str, Any]]:
    """The crawl's queue on a reachable Redis (*wait*'s URL, waited for as *wait* says, then
    failing naming it), joined by this worker (*sender*: its nonce in ``sent``, see
    :mod:`scrapy_ha.store.join`), and the server's ``INFO`` as read then; flushed first with
    ``SCHEDULER_FLUSH_ON_START`` when no other worker lives."""
    settings = crawler.settings
    shards = shard_setting(settings)
    _refuse_unsharded_features(settings, shards)
    if isinstance(spider, RedisSpiderMixin):  # refused before connecting: nothing to undo
        key = spider.redis_key or start_key(config.start_urls_key, spider.name)
        check_start_key(settings, key, Keys(config.key_prefix, spider.name).ready)
    redis_url = wait.redis_url
    client, info = await wait.run(lambda: _reachable_client(settings, config, redis_url))
    prefix, heartbeat_ms = config.key_prefix, int(config.heartbeat_ttl * 1000)
    try:
        await warn_once(client, redis_url, info)
        await name_left_queue(client, settings, spider.name)
        if config.flush_on_start:
            await wait.run(lambda: _flush_on_start(client, prefix, spider.name))
        if shards == 1:  # (a sharded crawl's keys: once its layout is known, below)
            await wait.run(lambda: garbage_aside(make_queue(client, prefix, spider.name, 1)))
        joined = await wait.run(
            lambda: join_crawl(
                client,
                prefix,
                spider.name,
                shards=shards,
                worker=config.worker_id,
                registration_ms=heartbeat_ms,
                sender=sender,
            )
        )
    except BaseException:
        await client.aclose()
        raise
    queue = make_queue(
        client,
        config.key_prefix,
        spider.name,
        shards,
        order=config.order,
        start_order=config.start_order,
        worker=config.worker_id,
        heartbeat_ms=heartbeat_ms,
        span=joined.span,
    )
    ttl = config.dupefilter_ttl
    try:  # the dupefilter as stored; one of the other kind is refused (join_crawl's span
        if shards > 1:  # (and the archive declared in the shards a grown crawl added)
            await wait.run(lambda: garbage_aside(queue))
            await wait.run(lambda: spread_declaration(queue))
        await wait.run(  # is the crawl's)
            lambda: set_dupefilter(queue, config.memory, ttl, claim=False)
        )
        await _bloom_fits(queue, config, info)  # before the claim: a refused worker's
        await wait.run(  # claim outlived it, and refused a push of the other kind
            lambda: claim_kind(queue, config.memory, ttl, config.worker_id)
        )
        await queue.upgrade()  # a crawl stored before the back queues is converted
    except ConfigError:  # refused: not a live worker of the crawl (the fix may be a flush)
        try:
            await leave_crawl(client, prefix, spider.name, joined, config.worker_id)
        except redis.RedisError as exc:
            logger.debug("Could not take this refused worker's registration back: %s", exc)
        finally:
            await client.aclose()
        raise
    except BaseException:
        await client.aclose()
        raise
    return queue, info


async def garbage_aside(queue: RedisQueue) -> None:
    """Set aside the crawl's keys of another type before the start reads them (each made
    the start fail on ``WRONGTYPE``, naming no key: a QA run)."""
    say_set_aside(await queue.set_aside_wrong_types())


def say_set_aside(moved: list[str]) -> None:
    """One ERROR naming the crawl's keys set aside (at start, or by :meth:`.Ends.bad_data`)."""
    if moved:
        logger.error(
            "Keys of the crawl held the wrong type of data and were renamed to "
            "<key>:corrupt:<time> (their content is kept there): %s",
            "; ".join(moved),
        )


async def _bloom_fits(queue: RedisQueue, config: SchedulerConfig, info: dict[str, Any]) -> None:
    """Refuse a new Bloom filter whose first layers cannot fit in Redis (see
    :func:`~scrapy_ha.store.bloom.first_layer_room`): one a shard (each shard has its own
    filter; a review: four shards of a 14 MB layer in a 20 MB Redis passed a check of one);
    a shard's filter already made is the crawl's (and time slices, ``HA_DUPEFILTER_TTL``,
    are not looked at: their keys are the slices'). On a Redis Cluster, whose ``INFO`` is
    per node, nothing is checked."""
    memory = config.memory
    if memory.dupefilter != "bloom" or config.dupefilter_ttl:
        return
    shards = shards_of(queue)
    new = [s for s in shards if not await s.client.exists(s.keys.bloom_part(0, 0))]
    if not new:
        return
    problem = first_layer_room(memory.capacity, memory.error_rate, info, layers=len(new))
    if problem is not None:
        raise ConfigError(problem)


#: What would act on one shard alone: refused with HA_SHARDS > 1 rather than half working.
#: The per-domain limits are kept by each shard's script, so each shard would allow the
#: whole limit.
UNSHARDED_SETTINGS = {
    "HA_DOMAIN_RATE": "each shard would allow the whole limit (N times it in all)",
    "HA_DOMAIN_CONCURRENCY": "each shard would allow the whole limit (N times it in all)",
    "HA_DOMAIN_LIMITS": "each shard would allow the whole limit (N times it in all)",
    "HA_REVISIT": "one revisit per URL is kept in the shard of the entry, not of the URL",
}


def _refuse_unsharded_features(settings: BaseSettings, shards: int) -> None:
    for name, why in UNSHARDED_SETTINGS.items():
        if shards > 1 and settings.get(name):
            raise ConfigError(
                f"{name} is not supported yet with HA_SHARDS={shards}: {why}; unset it or "
                "use HA_SHARDS=1"
            )


def log_connected(queue: RedisQueue, server: str, redis_url: str, worker: str) -> None:
    logger.info(
        "scrapy-ha %s (Scrapy %s, redis-py %s, Redis %s) at %s, keys %s, worker %s",
        __version__,
        scrapy.__version__,
        redis.__version__,
        server,
        redis_url,
        _key_pattern(queue),
        worker,
    )


def _key_pattern(queue: RedisQueue) -> str:
    keys = queue.keys
    if keys.shard is None:
        return keys.ready.rsplit(":", 1)[0] + ":*"
    return f"{keys.prefix}:{{{keys.spider}:0..{len(keys.every_shard()) - 1}}}:*"


async def _flush_on_start(client: Any, prefix: str, spider: str) -> None:
    queue = await queue_in_redis(client, prefix, spider)
    counts = await queue.counts()
    if counts.workers:
        logger.warning(
            "SCHEDULER_FLUSH_ON_START ignored: %d other worker(s) of %s are alive",
            counts.workers,
            queue.keys.spider,
        )
        return
    await queue.flush()
    logger.info("Flushed the queue of %s (SCHEDULER_FLUSH_ON_START)", queue.keys.spider)


async def join_run(queue: RedisQueue, config: SchedulerConfig) -> Run:
    """The run of the crawl this worker joins (:mod:`scrapy_ha.store.runs`). It writes the
    worker's heartbeat in the same call: of two workers starting together, the second finds
    the first alive and joins its run, so call it before the first renewal."""
    return await open_run(queue, config.worker_id, int(config.heartbeat_ttl * 1000))


async def joined(
    queue: RedisQueue, config: SchedulerConfig, spider: Spider, starts: StartReport, run: Run
) -> Counts:
    """The crawl's counts, read once so that ``len()`` and ``has_pending_requests()``
    answer for it from the start; says so when joining a crawl already in Redis, or when
    starting the next run of one kept in Redis, and names the sinks of the item stream a
    worker without the outbox does not feed."""
    counts = await queue.counts()
    await say_unfed_sinks(queue, config.items)
    if counts.pending + counts.leased + counts.delayed or counts.dead:
        starts.joining = True
        logger.info(
            "Joining a crawl already in Redis: %d pending, %d leased, %d delayed, "
            "%d dead-lettered, %d other live worker(s) (run %d)",
            counts.pending,
            counts.leased,
            counts.delayed,
            counts.dead,
            max(0, counts.workers - 1),
            run.number,
        )
    elif run.started and run.number > 1 and counts.fingerprints and config.dedupe:
        logger.info(
            "Run %d of the crawl of %s: %d fingerprints of its earlier runs are in Redis "
            "(kept by SCHEDULER_PERSIST=True, or left by a run that did not end cleanly), "
            "so its dont_filter start requests are crawled again, and every other request "
            "seen before is filtered: this run crawls what is new. To crawl again from scratch: "
            "`scrapy-ha flush %s`, or SCHEDULER_FLUSH_ON_START=True",
            run.number,
            spider.name,
            counts.fingerprints,
            spider.name,
        )
    return counts


class StartReport:
    """How many of this worker's start requests the crawl had seen already, said once at
    INFO when ``start()`` is exhausted and all of them have reached Redis: a worker that
    joins a crawl would otherwise leave its user wondering why their start URLs were not
    crawled. Said by a joining worker always, by any other only when some were seen (two
    workers starting at once). Counted in ``ha/start_filtered``.

    Start requests are the requests no page yielded (a request an extension hands to the
    engine outside a callback counts with them)."""

    def __init__(self, crawler: Crawler, outbox: Outbox) -> None:
        self.crawler = crawler
        self.outbox = outbox
        self.joining = False  # the crawl had work in Redis when this worker opened
        self.sent = 0
        self.seen = 0
        self.said = False

    def count(self, result: SyncResult, sent: list[NewEntry]) -> None:
        """Count one sync's start requests; say the totals once the last is in Redis."""
        if result.roots_seen:
            assert self.crawler.stats is not None
            self.crawler.stats.inc_value("ha/start_filtered", result.roots_seen)
        if self.said:
            return
        self.sent += sum(1 for entry in sent if entry.parent is None)
        self.seen += result.roots_seen
        if engine.start_exhausted(self.crawler) and not any(
            entry.parent is None for entry in self.outbox.children
        ):
            self.said = True
            self._say()

    def _say(self) -> None:
        if not self.sent or not (self.joining or self.seen):
            return
        logger.info(
            "%d of this worker's %d start request(s) were already in the crawl (its shared "
            "dupefilter had seen them): not crawled again%s",
            self.seen,
            self.sent,
            "" if self.seen < self.sent else "; this worker works on what the crawl holds",
        )
