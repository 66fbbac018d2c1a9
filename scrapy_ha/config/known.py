"""The settings scrapy-ha reads. A setting named ``HA_*`` that is none of them is likely a
typo (``HA_ITEM`` for ``HA_ITEMS``) that would silently do nothing: the scheduler says so
at start, in one WARNING per name, with the nearest known name. It also names settings
that do nothing beside others, and a local feed export a SIGKILL would lose items of."""

from __future__ import annotations

import difflib
import logging
import os
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from scrapy_ha.config.items import items_mode
from scrapy_ha.config.validate import ConfigError

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = ["KNOWN", "unknown", "warn_unknown"]

logger = logging.getLogger(__name__)

#: The dashboard's environment variable (``scrapy_ha.dashboard._guard``): in KNOWN, as the
#: code names it, but no setting: given in settings, it is named at start.
TOKEN_ENV = "HA_DASHBOARD_TOKEN"
#: Every ``HA_*`` setting of scrapy-ha (tests/test_config.py checks it against the code).
KNOWN = frozenset(
    {
        "HA_ALLOWED_SCHEMES",
        "HA_BAN_CHECK",
        "HA_CHECKPOINTS",
        "HA_CHECKPOINT_ID_FIELD",
        "HA_CHECKPOINT_ITEMS",
        "HA_CHECKPOINT_MAX_BYTES",
        "HA_CHECKPOINT_RERUN",
        "HA_CHECKPOINT_TTL",
        "HA_CLOSE_TIMEOUT",
        "HA_CODEC_CLASSES",
        "HA_COMPACT_PAYLOADS",
        "HA_CONNECT_TIMEOUT",
        "HA_COOKIES_TTL",
        "HA_DASHBOARD_TOKEN",
        "HA_DEDUPE_START_REQUESTS",
        "HA_DLQ_ALERT_THRESHOLD",
        "HA_DLQ_ALERT_WEBHOOK",
        "HA_DLQ_ARCHIVE_TABLE",
        "HA_DLQ_ARCHIVE_URL",
        "HA_DLQ_MAX_AGE",
        "HA_DLQ_MAX_ENTRIES",
        "HA_DLQ_WARN_THRESHOLD",
        "HA_DOMAIN_CONCURRENCY",
        "HA_DOMAIN_LIMITS",
        "HA_DOMAIN_RATE",
        "HA_DUPEFILTER",
        "HA_DUPEFILTER_CAPACITY",
        "HA_DUPEFILTER_ERROR_RATE",
        "HA_DUPEFILTER_TTL",
        "HA_EARLY_DOWNLOAD",
        "HA_FEED",
        "HA_GC_FREEZE",
        "HA_HEARTBEAT_TTL",
        "HA_IDLE_TIMEOUT",
        "HA_ITEMS",
        "HA_ITEMS_PIPELINES",
        "HA_KEY_PREFIX",
        "HA_LEASE_RENEW_INTERVAL",
        "HA_LEASE_TIME",
        "HA_MAX_INFLIGHT",
        "HA_MAX_LEASE_EXPIRIES",
        "HA_PREFETCH",
        "HA_PROXY_ALLOW_DIRECT",
        "HA_PROXY_COOLDOWN",
        "HA_PROXY_HOST",
        "HA_PROXY_MAX_FAILURES",
        "HA_PROXY_MODE",
        "HA_PROXY_PASSWORD",
        "HA_PROXY_POOL_PARSER",
        "HA_PROXY_POOL_TTL",
        "HA_PROXY_POOL_URL",
        "HA_PROXY_PORT",
        "HA_PROXY_ROTATE_HEADER",
        "HA_PROXY_SESSION_TEMPLATE",
        "HA_PROXY_URL",
        "HA_PROXY_USER",
        "HA_QUEUE_ORDER",
        "HA_RECLAIM_BATCH",
        "HA_RECLAIM_INTERVAL",
        "HA_RECONNECT_MAX_DELAY",
        "HA_REDIS_MEMORY_HIGH",
        "HA_REDIS_MEMORY_LOW",
        "HA_RENEW_WATCHDOG",
        "HA_RETRY_AFTER_MAX",
        "HA_RETRY_BACKOFF_BASE",
        "HA_RETRY_BACKOFF_MAX",
        "HA_RETRY_BACKOFF_MULTIPLIER",
        "HA_RETRY_ENABLED",
        "HA_RETRY_JITTER",
        "HA_RETRY_PERMANENT_EXCEPTIONS",
        "HA_RETRY_POLICIES",
        "HA_RETRY_STATUS_CLASSES",
        "HA_RETRY_TIMES",
        "HA_REVISIT",
        "HA_REVISIT_ADAPTIVE",
        "HA_REVISIT_BUDGET",
        "HA_REVISIT_MAX",
        "HA_REVISIT_MAX_FAILURES",
        "HA_REVISIT_MIN",
        "HA_REVISIT_SIGNATURE",
        "HA_SHARDS",
        "HA_SHARED_COOKIES",
        "HA_START_TIMEOUT",
        "HA_TICK",
        "HA_TIMER_SWEEP",
        "HA_UNSTORABLE",
        "HA_USER_AGENTS",
        "HA_WORKER_ID",
    }
)


#: Settings read only while their switch (a boolean) is on: set with it off, they do nothing.
SWITCHED = {
    "HA_REVISIT_ADAPTIVE": ("HA_REVISIT_BUDGET", "HA_REVISIT_MAX", "HA_REVISIT_MIN"),
    "HA_CHECKPOINTS": (
        "HA_CHECKPOINT_ID_FIELD",
        "HA_CHECKPOINT_ITEMS",
        "HA_CHECKPOINT_MAX_BYTES",
        "HA_CHECKPOINT_RERUN",
        "HA_CHECKPOINT_TTL",
    ),
}


#: Where the proxy is and its credentials: settings, or environment variables of the same
#: names (``scrapy_ha.config.middlewares``), as ``HA_PROXY_MODE`` is.
PROXY_WHERE = (
    "HA_PROXY_URL",
    "HA_PROXY_HOST",
    "HA_PROXY_PORT",
    "HA_PROXY_USER",
    "HA_PROXY_PASSWORD",
    "HA_PROXY_POOL_URL",
)
#: The proxy's settings, read only with ``HA_PROXY_MODE`` (a QA run: ``HA_PROXY_URL`` alone,
#: the setting a user reaches for first, did nothing, and every request went direct).
PROXY_SETTINGS = (
    *PROXY_WHERE,
    "HA_PROXY_POOL_PARSER",
    "HA_PROXY_POOL_TTL",
    "HA_PROXY_SESSION_TEMPLATE",
    "HA_PROXY_ROTATE_HEADER",
    "HA_PROXY_COOLDOWN",
    "HA_PROXY_MAX_FAILURES",
    "HA_PROXY_ALLOW_DIRECT",
)
#: The proxy settings also read from environment variables; the others are settings only,
#: and one given in the environment alone did nothing, silently (a QA run:
#: ``HA_PROXY_COOLDOWN=30`` exported beside ``HA_PROXY_MODE`` kept proxies out 300 s).
PROXY_FROM_ENVIRONMENT = ("HA_PROXY_MODE", *PROXY_WHERE)

#: scrapy-redis's settings that scrapy-ha does not read (a project moved from scrapy-redis
#: keeps them, and they did nothing, silently: a QA run's sorted set of start URLs failed
#: every read with WRONGTYPE), each with what does their job here.
SCRAPY_REDIS_UNREAD = {
    "SCHEDULER_QUEUE_CLASS": "the order within a priority is HA_QUEUE_ORDER ('lifo' or 'fifo')",
    "SCHEDULER_QUEUE_KEY": "the crawl's keys are HA_KEY_PREFIX:{spider}:*",
    "SCHEDULER_DUPEFILTER_KEY": "the crawl's keys are HA_KEY_PREFIX:{spider}:*",
    "SCHEDULER_DUPEFILTER_CLASS": "the dupefilter is DUPEFILTER_CLASS and HA_DUPEFILTER",
    "SCHEDULER_SERIALIZER": "requests are stored as versioned JSON, never pickled",
    "SCHEDULER_IDLE_BEFORE_CLOSE": "an idle worker waits HA_IDLE_TIMEOUT (HA_FEED: for ever)",
    "REDIS_START_URLS_AS_ZSET": (
        "start URLs are read from a list, or a set with REDIS_START_URLS_AS_SET = True; a "
        "sorted set is not read (move its members into a list)"
    ),
    "MAX_IDLE_TIME_BEFORE_CLOSE": (
        "a RedisSpider waits for start URLs for ever (HA_FEED); with HA_FEED = False it "
        "closes once the crawl is empty (after HA_IDLE_TIMEOUT while other workers live)"
    ),
}


#: Scrapy's storage of local feeds, which writes through Python's buffer
SCRAPY_FILE_STORAGE = "scrapy.extensions.feedexport.FileFeedStorage"


def unknown(settings: BaseSettings) -> list[str]:
    """One line for each ``HA_*`` setting in *settings* that scrapy-ha does not read, and
    one for each switch of :data:`SWITCHED` that is off while settings it switches are set."""
    lines = []
    for switch, names in SWITCHED.items():
        given = [name for name in names if settings.get(name) is not None]
        try:
            off = not settings.getbool(switch, False)
        except ValueError:  # a bad value: its component names it
            off = False
        if given and off:
            does = "does" if len(given) == 1 else "do"
            lines.append(f"{', '.join(given)} {does} nothing while {switch} is not True")
    if _switched_on(settings, "HA_CHECKPOINTS") and not _checkpoint_middleware(settings):
        lines.append(
            "HA_CHECKPOINTS does nothing without scrapy_ha.checkpoint.CheckpointMiddleware in "
            'SPIDER_MIDDLEWARES (the add-on adds it: ADDONS = {"scrapy_ha.Addon": 0})'
        )
    given = [name for name in PROXY_SETTINGS if settings.get(name) is not None]
    if given and not _proxy_mode(settings):
        does = "does" if len(given) == 1 else "do"
        lines.append(
            f"{', '.join(given)} {does} nothing while HA_PROXY_MODE is not set: requests go "
            "direct (HA_PROXY_MODE = 'tunnel' for one proxy URL, 'pool' for a proxy list API)"
        )
    lines += _combinations(settings)
    lines += _environment_only(settings)
    lines += _buffered_feeds(settings)
    lines += _settings_only(settings)
    for name, instead in SCRAPY_REDIS_UNREAD.items():
        if settings.get(name) not in (None, False, "False", "false", "0", 0):
            lines.append(f"{name} is scrapy-redis's and does nothing in scrapy-ha: {instead}")
    for name in sorted(str(name) for name in settings):
        if not name.upper().startswith("HA_") or name in KNOWN:
            continue  # (Scrapy's settings are case-sensitive: ha_lease_time does nothing)
        near = difflib.get_close_matches(name.upper(), KNOWN, n=1, cutoff=0.7)
        hint = f"; did you mean {near[0]}?" if near else " (see docs/reference.md)"
        lines.append(f"{name} is not a setting of scrapy-ha: it does nothing{hint}")
    return lines


def _combinations(settings: BaseSettings) -> list[str]:
    """A line for each setting that does nothing, or not all it says, beside another."""
    lines = []
    if settings.get("HA_DUPEFILTER_ERROR_RATE") is not None and settings.get(
        "HA_DUPEFILTER", "set"
    ) in (None, "set"):  # (a QA run: accepted silently, the exact set errs never)
        lines.append(
            "HA_DUPEFILTER_ERROR_RATE does nothing with the exact set (HA_DUPEFILTER = 'set' "
            "never errs): it is the Bloom filter's, HA_DUPEFILTER = 'bloom'"
        )
    if (
        settings.get("HA_CHECKPOINT_ITEMS") is not None
        and _switched_on(settings, "HA_CHECKPOINTS")
        and _outbox(settings)
    ):  # (a QA run: accepted silently, no mid-page checkpoint is saved with the outbox)
        lines.append(
            "HA_CHECKPOINT_ITEMS does nothing with HA_ITEMS = 'outbox': a page's checkpoint "
            "is saved with its ack, which commits its items, and no mid-page checkpoint is "
            "saved"
        )
    if _switched_on(settings, "AUTOTHROTTLE_ENABLED") and _paced(settings):
        lines.append(  # (a QA run: 14 starts in a second at a rate of 5, three workers)
            "AUTOTHROTTLE_ENABLED with a crawl-wide rate (HA_DOMAIN_RATE, HA_DOMAIN_LIMITS): a "
            "worker AutoThrottle holds back sends the requests it leased seconds late, on top "
            "of the other workers' starts, so a domain may get more than its rate in a second; "
            "leave AutoThrottle off where the rate must hold (docs/scaling.md)"
        )
    return lines


def _buffered_feeds(settings: BaseSettings) -> list[str]:
    """A local feed export that Scrapy's own ``FileFeedStorage`` writes (the scheduler
    without the add-on): its items wait in Python's file buffer, and a SIGKILL loses them
    with their pages already acked (a QA run: 23 of 400 items, never crawled again). And one
    opened with overwrite (``-O``), whatever writes it: each worker that opens it empties it
    (a QA run: two workers started with the same ``-O items.jl``, 1,000 of 2,000 items left)."""
    try:
        feeds = settings.getdict("FEEDS")
        storages = settings.getwithbase("FEED_STORAGES")
    except (ValueError, TypeError):  # a bad value: Scrapy's feed exporter names it
        return []
    local = {str(uri): opts for uri, opts in feeds.items() if _scheme(str(uri)) in ("", "file")}
    buffered = [uri for uri in local if _name(storages.get(_scheme(uri))) == SCRAPY_FILE_STORAGE]
    emptied = [
        uri
        for uri, opts in local.items()
        if isinstance(opts, dict) and opts.get("overwrite") and not _new_each_time(uri)
    ]
    lines = []
    if emptied:
        lines.append(
            f"the feed export to {', '.join(emptied)} is opened with overwrite (-O): each "
            "worker that opens it empties it, so another worker of the crawl writing to it, or "
            "this one started again, loses the items written there before, their pages acked "
            "and never crawled again; append (-o)"
        )
    if buffered:
        lines.append(
            f"the feed export to {', '.join(buffered)} is written by Scrapy's FileFeedStorage: "
            "a SIGKILLed worker loses the items its buffer holds, their pages acked and never "
            'crawled again; use the add-on (ADDONS = {"scrapy_ha.Addon": 0}), or set '
            'FEED_STORAGES = {"": STORAGE, "file": STORAGE} with STORAGE = '
            '"scrapy_ha.sinks.feeds.WrittenThroughFileFeedStorage"'
        )
    return lines


def _new_each_time(uri: str) -> bool:
    """Does the feed's URI name a new file each time a worker opens it (its time in it)?"""
    return "%(time)s" in uri or "%(batch_time)s" in uri


def _scheme(uri: str) -> str:
    """A feed URI's scheme as Scrapy picks its storage (``C:\\x.jl``: a local path)."""
    scheme = urlparse(uri).scheme
    return "" if len(scheme) == 1 else scheme


def _name(component: object) -> str:
    """A component given as a class or by its import path, by its import path."""
    if isinstance(component, str):
        return component
    return f"{getattr(component, '__module__', '')}.{getattr(component, '__qualname__', '')}"


def _environment_only(settings: BaseSettings) -> list[str]:
    """The dashboard's token given as a setting, which nothing reads (known for the check of
    the code's names: the dashboard reads an environment variable of that name)."""
    if settings.get(TOKEN_ENV) is None:
        return []
    return [
        f"{TOKEN_ENV} is not a setting: it does nothing in settings; `scrapy-ha dashboard` "
        f"reads its token from --token or the environment variable {TOKEN_ENV}"
    ]


def _proxy_mode(settings: BaseSettings) -> bool:
    """Is a proxy mode set, in settings or in the environment?"""
    return bool(settings.get("HA_PROXY_MODE") or os.environ.get("HA_PROXY_MODE"))


def _settings_only(settings: BaseSettings) -> list[str]:
    """Proxy settings given as environment variables alone, which nothing reads there;
    only in a proxy mode (without one, no proxy setting is read: a crawl that uses no
    proxy is not told about those a shell exported)."""
    if not _proxy_mode(settings):
        return []
    unread = [
        name
        for name in PROXY_SETTINGS
        if name not in PROXY_FROM_ENVIRONMENT
        and os.environ.get(name)
        and settings.get(name) is None
    ]
    if not unread:
        return []
    return [
        f"{', '.join(unread)} in the environment {'does' if len(unread) == 1 else 'do'} "
        f"nothing: give {'it' if len(unread) == 1 else 'them'} in settings (or -s); of the "
        f"proxy's settings only {', '.join(PROXY_FROM_ENVIRONMENT)} are read from the "
        "environment"
    ]


def _outbox(settings: BaseSettings) -> bool:
    """Is ``HA_ITEMS`` the outbox (a bad value: its component names it)?"""
    try:
        return items_mode(settings) == "outbox"
    except ConfigError:
        return False


def _paced(settings: BaseSettings) -> bool:
    """Does the crawl set a crawl-wide rate (a bad value: its component names it)?"""
    try:
        if settings.getfloat("HA_DOMAIN_RATE", 0) > 0:
            return True
        limits = settings.getdict("HA_DOMAIN_LIMITS")
    except (ValueError, TypeError):
        return False
    return any(isinstance(v, dict) and v.get("rate") for v in limits.values())


def _switched_on(settings: BaseSettings, switch: str) -> bool:
    try:
        return settings.getbool(switch, False)
    except ValueError:  # a bad value: its component names it
        return False


def _checkpoint_middleware(settings: BaseSettings) -> bool:
    """Is the checkpoint middleware among the spider middlewares (by its name: this layer
    imports no middleware)?"""
    for component, order in settings.getwithbase("SPIDER_MIDDLEWARES").items():
        name = getattr(component, "__name__", str(component))
        if order is not None and name.rsplit(".", 1)[-1] == "CheckpointMiddleware":
            return True
    return False


def warn_unknown(settings: BaseSettings) -> None:
    """Log :func:`unknown`'s lines as WARNINGs."""
    for line in unknown(settings):
        logger.warning("%s", line)
