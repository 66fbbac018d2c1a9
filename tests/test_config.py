"""Settings: defaults and clear errors naming the setting and the value."""

from __future__ import annotations

import os
import re
import socket

import pytest
from scrapy.settings import Settings

from scrapy_ha.config import validate as check
from scrapy_ha.config.middlewares import UserAgentConfig
from scrapy_ha.config.retry import RetryConfig
from scrapy_ha.config.scheduler import SchedulerConfig
from scrapy_ha.config.validate import ConfigError


def test_defaults():
    config = SchedulerConfig.from_settings(Settings({"CONCURRENT_REQUESTS": 32}))
    assert (config.lease_time, config.renew_interval, config.max_lease_expiries) == (30, 10, 3)
    assert config.prefetch == 32
    assert re.fullmatch(
        rf"{re.escape(socket.gethostname())}:{os.getpid()}:[0-9a-f]{{6}}", config.worker_id
    ), config.worker_id


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"HA_LEASE_TIME": "soon"}, "HA_LEASE_TIME='soon' is not a number"),
        ({"HA_LEASE_TIME": -1}, "HA_LEASE_TIME=-1 must be more than 0"),
        ({"HA_PREFETCH": 0}, "HA_PREFETCH=0 must be a whole number"),
        ({"HA_PREFETCH": "2.5"}, "HA_PREFETCH='2.5' must be a whole number"),
        ({"HA_MAX_LEASE_EXPIRIES": None, "HA_RECLAIM_BATCH": "x"}, "HA_RECLAIM_BATCH='x'"),
        ({"HA_LEASE_TIME": 5, "HA_LEASE_RENEW_INTERVAL": 5}, "HA_LEASE_RENEW_INTERVAL=5.0 must be"),
        ({"HA_HEARTBEAT_TTL": 5}, "HA_HEARTBEAT_TTL=5.0 must be longer"),
        ({"HA_KEY_PREFIX": "a{b}"}, "HA_KEY_PREFIX='a{b}'"),
        # a QA run: taken (a newline), and printed as it was
        ({"HA_KEY_PREFIX": "h\na"}, "HA_KEY_PREFIX='h\\na' must be non-empty, printable,"),
        # a QA run: the worker never saw it was idle, and never closed
        ({"HA_TICK": "1e8"}, "HA_TICK='1e8' must be more than 0 seconds (at most 60)"),
        ({"HA_FEED": "maybe"}, "HA_FEED='maybe' must be True or False"),
        ({"DUPEFILTER_CLASS": "my.Bloom"}, "DUPEFILTER_CLASS='my.Bloom' cannot be used with"),
        ({"JOBDIR": "crawls/1"}, "JOBDIR='crawls/1' cannot be used with scrapy_ha.Scheduler"),
        ({"HA_UNSTORABLE": "skip"}, "HA_UNSTORABLE='skip' must be one of 'error' or 'drop-key'"),
        ({"HA_CLOSE_TIMEOUT": 0}, "HA_CLOSE_TIMEOUT=0 must be more than 0 seconds"),
        ({"HA_START_TIMEOUT": -1}, "HA_START_TIMEOUT=-1 must be 0 or more seconds"),
        ({"HA_START_TIMEOUT": "1m"}, "HA_START_TIMEOUT='1m' is not a number"),
        ({"HA_CLOSE_TIMEOUT": "long"}, "HA_CLOSE_TIMEOUT='long' is not a number"),
        # NaN passed every bound (a worker that crawled nothing, or blamed REDIS_URL); inf
        # and 1e23 stopped a worker in its close, or had Redis refuse every call for ever
        ({"HA_TICK": "nan"}, "HA_TICK='nan' is not a number (NaN)"),
        ({"HA_CONNECT_TIMEOUT": "nan"}, "HA_CONNECT_TIMEOUT='nan' is not a number (NaN)"),
        ({"HA_LEASE_TIME": "nan"}, "HA_LEASE_TIME='nan' is not a number (NaN)"),
        ({"HA_TIMER_SWEEP": "nan"}, "HA_TIMER_SWEEP='nan' is not a number (NaN)"),
        ({"HA_LEASE_TIME": "inf"}, "HA_LEASE_TIME='inf' must be more than 0 seconds (at most"),
        ({"HA_LEASE_TIME": "1e23"}, "HA_LEASE_TIME='1e23' must be more than 0 seconds (at most"),
        ({"HA_CLOSE_TIMEOUT": "inf"}, "HA_CLOSE_TIMEOUT='inf' must be more than 0 seconds (at"),
        ({"HA_IDLE_TIMEOUT": "inf"}, "HA_IDLE_TIMEOUT='inf' must be 0 or more seconds (at most"),
        # a QA run of every setting: taken, then each request naming the class was
        # dead-lettered as corrupt, a queue class read for its order alone, Redis refusing
        # every reclaim, a retry said to wait 1e15 s
        ({"HA_CODEC_CLASSES": "http:HTTPStatuss"}, "names 'http:HTTPStatuss', which cannot be"),
        ({"HA_CODEC_CLASSES": ":::"}, "HA_CODEC_CLASSES names ':::', which cannot be imported"),
        ({"HA_CODEC_CLASSES": 5}, "HA_CODEC_CLASSES=5 must be a list"),
        ({"HA_CODEC_CLASSES": "[1]"}, "HA_CODEC_CLASSES='[1]': 1 is no class name"),
        ({"HA_CODEC_CLASSES": "os.sep"}, "HA_CODEC_CLASSES names 'os.sep', which is not a class"),
        # a review: passed the check, and a payload names the class by its own module
        ({"HA_CODEC_CLASSES": "json.JSONDecoder"}, "which is json.decoder:JSONDecoder (another"),
        ({"HA_CODEC_CLASSES": "Color"}, "HA_CODEC_CLASSES='Color': 'Color' is no class name"),
        ({"HA_CODEC_CLASSES": "tests.raising_module:X"}, "cannot be imported: RuntimeError: "),
        ({"SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.DownloaderAwarePriorityQueu"}, "cannot be"),
        ({"SCHEDULER_PRIORITY_QUEUE": 5}, "SCHEDULER_PRIORITY_QUEUE=5 is not a class"),
        ({"SCHEDULER_MEMORY_QUEUE": "nosuch.Q"}, "SCHEDULER_MEMORY_QUEUE='nosuch.Q' cannot be"),
        ({"SCHEDULER_START_MEMORY_QUEUE": "os.path.join"}, "='os.path.join' is not a class"),
        (  # (a QA run: a module that raises at import ended the start in a traceback)
            {"SCHEDULER_DISK_QUEUE": "tests.raising_module.Q"},
            "SCHEDULER_DISK_QUEUE='tests.raising_module.Q' cannot be imported: RuntimeError: ",
        ),
        (
            {"HA_REDIS_MEMORY_HIGH": 90},
            "HA_REDIS_MEMORY_HIGH=90 is 90 bytes, less than an empty Redis uses: give a "
            "fraction of maxmemory (0 to 1: 0.9 for 90 %)",
        ),
        ({"HA_RECLAIM_INTERVAL": 0.0009}, "HA_RECLAIM_INTERVAL=0.0009 must be at least 0.001"),
        ({"HA_LEASE_TIME": True}, "HA_LEASE_TIME=True is not a number"),
        ({"HA_DUPEFILTER_TTL": True}, "HA_DUPEFILTER_TTL=True is not a number"),
        ({"HA_RECLAIM_BATCH": "1e19"}, "HA_RECLAIM_BATCH='1e19' must be at most 1,000,000 ("),
        ({"DUPEFILTER_CLASS": 5}, "DUPEFILTER_CLASS=5 is not a class"),
    ],
)
def test_a_bad_setting_names_itself_and_its_value(settings, message):
    with pytest.raises(ConfigError) as info:
        SchedulerConfig.from_settings(Settings(settings))
    assert message in str(info.value)


def test_list_settings_take_a_json_list_from_the_command_line():
    """A QA run: ``-s 'HA_ALLOWED_SCHEMES=["http","https"]'`` was refused as the scheme
    '["http"', and ``HA_CODEC_CLASSES`` so written was taken as one name no class has."""
    from scrapy_ha.codec.trust import _listed

    given = Settings(
        {"HA_ALLOWED_SCHEMES": '["http", "HTTPS"]', "HA_CODEC_CLASSES": '["http:HTTPStatus"]'}
    )
    config = SchedulerConfig.from_settings(given)
    assert config.allowed_schemes == frozenset({"http", "https"})
    from http import HTTPStatus

    class Spider:
        class crawler:
            settings = given

    assert _listed(HTTPStatus, Spider())
    retry = RetryConfig.from_settings(
        Settings({"HA_RETRY_PERMANENT_EXCEPTIONS": '["builtins.KeyError"]'})
    )
    assert KeyError in retry.permanent_exceptions


@pytest.mark.parametrize(
    ("config", "settings", "message"),
    [
        (RetryConfig, {"HA_RETRY_BACKOFF_BASE": "1e15"}, "='1e15' must be at most 1e+09 seconds"),
        (RetryConfig, {"HA_RETRY_BACKOFF_MAX": "1e15"}, "='1e15' must be at most 1e+09 seconds"),
        (RetryConfig, {"HA_RETRY_PERMANENT_EXCEPTIONS": 5}, "EXCEPTIONS=5 must be a list"),
        (
            RetryConfig,
            {"HA_RETRY_PERMANENT_EXCEPTIONS": ["tests.raising_module.E"]},
            "names 'tests.raising_module.E', which cannot be imported: RuntimeError: needs",
        ),
        (UserAgentConfig, {"HA_USER_AGENTS": 5}, "HA_USER_AGENTS=5 must be a list of non-empty"),
        (UserAgentConfig, {"HA_USER_AGENTS": {"a": 1}}, "HA_USER_AGENTS={'a': 1} must be a list"),
        (UserAgentConfig, {"HA_USER_AGENTS": '{"a": 1}'}, "='{\"a\": 1}' must be a list of User"),
    ],
)
def test_a_bad_middleware_setting_names_itself_and_its_value(config, settings, message):
    """A QA run: a retry said to wait 1e15 s (retried every 10 s), a traceback where a
    list was read (``TypeError: 'int' object is not iterable``), a dict's keys taken."""
    with pytest.raises(ConfigError) as info:
        config.from_settings(Settings(settings))
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("value", "dedupe"),
    [
        (None, True),
        ("scrapy.dupefilters.RFPDupeFilter", True),
        ("scrapy_redis.dupefilter.RFPDupeFilter", True),
        ("scrapy.dupefilters.BaseDupeFilter", False),
    ],
)
def test_dupefilter_class_switches_redis_deduplication(value, dedupe):
    from scrapy.dupefilters import BaseDupeFilter, RFPDupeFilter

    assert SchedulerConfig.from_settings(Settings({"DUPEFILTER_CLASS": value})).dedupe is dedupe
    cls = {True: RFPDupeFilter, False: BaseDupeFilter}[dedupe]
    assert SchedulerConfig.from_settings(Settings({"DUPEFILTER_CLASS": cls})).dedupe is dedupe


def test_the_worker_id_names_the_scrapyd_job_once(monkeypatch):
    """``host:pid[:job]:random``, whether the job comes from scrapyd's environment, the
    spider's ``_job`` argument, or both (scrapyd sets both)."""
    from scrapy_ha.config.scheduler import default_worker_id

    prefix = f"{re.escape(socket.gethostname())}:{os.getpid()}"
    monkeypatch.delenv("SCRAPY_JOB", raising=False)
    assert re.fullmatch(rf"{prefix}:[0-9a-f]{{6}}", default_worker_id())
    assert re.fullmatch(rf"{prefix}:job7:[0-9a-f]{{6}}", default_worker_id("job7"))
    monkeypatch.setenv("SCRAPY_JOB", "job7")
    assert re.fullmatch(rf"{prefix}:job7:[0-9a-f]{{6}}", default_worker_id())
    assert re.fullmatch(rf"{prefix}:job7:[0-9a-f]{{6}}", default_worker_id("job7"))


def test_every_setting_the_code_reads_is_known_and_nothing_else():
    """The list the scheduler checks settings against is the code's own (a new setting
    missing from it would be called a typo)."""
    from pathlib import Path

    from scrapy_ha.config.known import KNOWN

    package = Path(__file__).parent.parent / "scrapy_ha"
    read = set()
    for path in package.rglob("*.py"):
        if path.name != "known.py":
            read |= set(re.findall(r"\"(HA_[A-Z0-9_]+)\"", path.read_text()))
    assert read == KNOWN


def test_a_mistyped_setting_is_named_with_the_nearest_at_start(caplog):
    """``HA_ITEM = "outbox"`` (for HA_ITEMS) did nothing, silently."""
    import logging

    from scrapy import Spider
    from scrapy.utils.test import get_crawler

    from scrapy_ha.scheduler.shell import Scheduler

    given = {
        "HA_ITEM": "outbox",
        "HA_LEASETIME": 5,
        "HA_WHATEVER": 1,
        "HA_LEASE_TIME": 20,
        "ha_lease_time": 5,  # a QA run: no warning (Scrapy's settings are case-sensitive)
    }
    with caplog.at_level(logging.WARNING):
        Scheduler.from_crawler(get_crawler(Spider, given))
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [
        "HA_ITEM is not a setting of scrapy-ha: it does nothing; did you mean HA_ITEMS?",
        "HA_LEASETIME is not a setting of scrapy-ha: it does nothing; did you mean HA_LEASE_TIME?",
        "HA_WHATEVER is not a setting of scrapy-ha: it does nothing (see docs/reference.md)",
        "ha_lease_time is not a setting of scrapy-ha: it does nothing; did you mean HA_LEASE_TIME?",
    ]


def test_a_setting_its_switch_leaves_unread_is_named_at_start(caplog):
    """``HA_REVISIT_MIN = 600`` without ``HA_REVISIT_ADAPTIVE = True`` did nothing, silently."""
    import logging

    from scrapy import Spider
    from scrapy.utils.test import get_crawler

    from scrapy_ha.scheduler.shell import Scheduler

    given = {"HA_REVISIT_MIN": 600, "HA_REVISIT_BUDGET": 5, "HA_CHECKPOINT_TTL": 60}
    for switches, expected in [
        (
            {},
            [
                "HA_REVISIT_BUDGET, HA_REVISIT_MIN do nothing while HA_REVISIT_ADAPTIVE is "
                "not True",
                "HA_CHECKPOINT_TTL does nothing while HA_CHECKPOINTS is not True",
            ],
        ),
        (
            {
                "HA_REVISIT_ADAPTIVE": "True",
                "HA_CHECKPOINTS": True,
                "SPIDER_MIDDLEWARES": {"scrapy_ha.checkpoint.CheckpointMiddleware": 900},
            },
            [],
        ),
        (
            {"HA_CHECKPOINTS": True, "HA_REVISIT_ADAPTIVE": "True"},  # (a QA run: silent)
            [
                "HA_CHECKPOINTS does nothing without scrapy_ha.checkpoint.CheckpointMiddleware "
                'in SPIDER_MIDDLEWARES (the add-on adds it: ADDONS = {"scrapy_ha.Addon": 0})'
            ],
        ),
    ]:
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            Scheduler.from_crawler(get_crawler(Spider, {**given, **switches}))
        assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == (
            expected
        )


@pytest.mark.parametrize("value", [-1, 2, "-1", "2", 0.5, "yes"])
def test_a_switch_takes_no_other_number_than_1_and_0(value):
    """Scrapy's getbool takes -1 and "2" for True and 0.5 for False: HA_GC_FREEZE=0.5 was
    taken as off without a word. Scrapy's own switches are read as Scrapy reads them."""
    with pytest.raises(ConfigError, match=rf"HA_GC_FREEZE={value!r} must be True or False"):
        check.boolean(Settings({"HA_GC_FREEZE": value}), "HA_GC_FREEZE", True)
    if value != "yes":  # (Scrapy refuses it too)
        taken = Settings({"COOKIES_ENABLED": value}).getbool("COOKIES_ENABLED")
        assert (
            check.boolean(
                Settings({"COOKIES_ENABLED": value}), "COOKIES_ENABLED", True, theirs=True
            )
            is taken
        )


@pytest.mark.parametrize(
    ("value", "taken"),
    [
        (True, True),
        (False, False),
        (1, True),
        (0, False),
        (1.0, True),
        ("1", True),
        ("0", False),
        ("True", True),
        ("true", True),
        ("False", False),
        ("false", False),
        (None, True),
    ],
)
def test_a_switch_takes_what_scrapy_takes_of_true_and_false(value, taken):
    assert check.boolean(Settings({"HA_GC_FREEZE": value}), "HA_GC_FREEZE", True) is taken


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"HA_REDIS_MEMORY_LOW": 0}, "HA_REDIS_MEMORY_LOW=0.0 would never let workers lease again"),
        ({"HA_REDIS_MEMORY_LOW": 0.95}, "HA_REDIS_MEMORY_LOW=0.95 must be below"),
    ],
)
def test_a_memory_mark_that_would_hold_workers_for_ever_is_refused(settings, says):
    """A QA run: HA_REDIS_MEMORY_LOW=0 was taken, and the workers it held back never leased
    again (Redis never uses less than 0 bytes)."""
    from scrapy_ha.config.memory import MemoryConfig

    with pytest.raises(ConfigError, match=re.escape(says)):
        MemoryConfig.from_settings(Settings(settings))
    MemoryConfig.from_settings(Settings({"HA_REDIS_MEMORY_HIGH": 0, "HA_REDIS_MEMORY_LOW": 0}))


@pytest.mark.parametrize(
    ("value", "taken"), [(1e9, 10**9), ("1e4", 10_000), (3e4, 30_000), ("20000", 20_000)]
)
def test_a_whole_number_may_be_written_as_a_float(value, taken):
    """A QA finding: ``-s HA_DUPEFILTER_CAPACITY=1e4`` (and ``1e9`` in settings.py, a float)
    were refused as "must be a whole number"."""
    from scrapy_ha.config.memory import MemoryConfig

    assert MemoryConfig.from_settings(Settings({"HA_DUPEFILTER_CAPACITY": value})).capacity == taken
    for bad in (2.5e4 + 0.5, "1e4.5", float("inf"), "inf", True):  # (inf: an OverflowError)
        with pytest.raises(ConfigError, match="must be a whole number"):
            check.whole(Settings({"X": bad}), "X", 1)


class Outer:
    class Inner:
        """A nested class a payload may name (HA_CODEC_CLASSES)."""


def test_the_forms_a_user_gives_of_a_list_are_taken():
    """A review of the start-time checks: a nested class in the dotted form was refused
    (``tests.test_config.Outer`` taken for a module), a set of user agents too."""
    from scrapy_ha.store.redis_params import check_query, parse_nodes

    nested = ["tests.test_config.Outer.Inner", "tests.test_config:Outer.Inner", "http.HTTPStatus"]
    SchedulerConfig.from_settings(Settings({"HA_CODEC_CLASSES": nested}))
    agents = UserAgentConfig.from_settings(Settings({"HA_USER_AGENTS": {"A/1", "B/2"}})).agents
    assert sorted(agents) == ["A/1", "B/2"]
    assert parse_nodes({"h:7000"}, 6379, "REDIS_CLUSTER_NODES") == (("h", 7000),)
    check_query("redis://h:1/0?socket_timeout=&health_check_interval=30")  # blank: dropped


def test_a_queue_class_given_as_itself_gives_its_order():
    """A review: ``SCHEDULER_MEMORY_QUEUE = scrapy.squeues.FifoMemoryQueue`` (the class,
    not its path) was read as LIFO: the class's own name is its factory's."""
    import scrapy.squeues

    fifo = {"SCHEDULER_MEMORY_QUEUE": scrapy.squeues.FifoMemoryQueue}
    assert SchedulerConfig.from_settings(Settings(fifo)).order == "fifo"
    lifo = {"SCHEDULER_START_MEMORY_QUEUE": scrapy.squeues.LifoMemoryQueue}
    assert SchedulerConfig.from_settings(Settings(lifo)).start_order == "lifo"


def test_a_number_past_its_bound_is_quoted_as_given():
    """A QA run: ``HA_SHARDS=1e300`` was refused quoting its 301 digits."""
    from scrapy_ha.store.sharding import shard_setting

    for read, name in (
        (shard_setting, "HA_SHARDS"),
        (SchedulerConfig.from_settings, "HA_RECLAIM_BATCH"),
    ):
        with pytest.raises(ConfigError) as info:
            read(Settings({name: 1e300}))
        assert str(info.value).startswith(f"{name}=1e+300 must be at most "), info.value


def test_the_dashboards_token_given_as_a_setting_is_named_at_start(caplog):
    """A QA run: ``HA_DASHBOARD_TOKEN`` in settings.py was taken as a known setting (no
    WARNING), but only ``scrapy-ha dashboard``'s environment variable of that name is read:
    the token set there protected nothing, silently."""
    import logging

    from scrapy import Spider
    from scrapy.utils.test import get_crawler

    from scrapy_ha.scheduler.shell import Scheduler

    with caplog.at_level(logging.WARNING):
        Scheduler.from_crawler(get_crawler(Spider, {"HA_DASHBOARD_TOKEN": "s3cret"}))
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [
        "HA_DASHBOARD_TOKEN is not a setting: it does nothing in settings; `scrapy-ha "
        "dashboard` reads its token from --token or the environment variable "
        "HA_DASHBOARD_TOKEN"
    ]


@pytest.mark.parametrize(
    ("given", "warned"),
    [
        ({"FEEDS": {"items.jl": {"format": "jsonlines"}}}, True),  # what `-o items.jl` sets
        ({"FEEDS": {"file:///tmp/items.jl": {"format": "jsonlines"}}}, True),
        ({"FEEDS": {"s3://bucket/items.jl": {"format": "jsonlines"}}}, False),  # not local
        ({}, False),
        (
            {
                "FEEDS": {"items.jl": {"format": "jsonlines"}},
                "FEED_STORAGES": {
                    "": "scrapy_ha.sinks.feeds.WrittenThroughFileFeedStorage",
                    "file": "scrapy_ha.sinks.feeds.WrittenThroughFileFeedStorage",
                },
            },
            False,
        ),
    ],
)
def test_a_local_feed_a_sigkill_would_lose_items_of_is_named_at_start(caplog, given, warned):
    """A QA run: with ``SCHEDULER = "scrapy_ha.Scheduler"`` alone, the README's one-line
    switch, and ``-o items.jl``, a worker SIGKILLed mid-crawl lost the 23 items in its
    feed's buffer, their pages acked: never crawled again, and nothing had said so."""
    import logging

    from scrapy import Spider
    from scrapy.utils.test import get_crawler

    from scrapy_ha.scheduler.shell import Scheduler

    with caplog.at_level(logging.WARNING):
        Scheduler.from_crawler(get_crawler(Spider, given))
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    said = [line for line in lines if "FileFeedStorage" in line]
    assert bool(said) is warned, lines
    if warned:
        assert "WrittenThroughFileFeedStorage" in said[0] and "scrapy_ha.Addon" in said[0]


@pytest.mark.parametrize(
    ("feeds", "warned"),
    [
        ({"items.jl": {"format": "jsonlines", "overwrite": True}}, True),  # `-O items.jl`
        ({"file:///tmp/items.jl": {"format": "jsonlines", "overwrite": True}}, True),
        ({"items.jl": {"format": "jsonlines"}}, False),  # `-o items.jl`: appended
        ({"s3://bucket/items.jl": {"format": "jsonlines", "overwrite": True}}, False),
        # a new file each time a worker opens it: nothing written before is emptied
        ({"items-%(time)s.jl": {"format": "jsonlines", "overwrite": True}}, False),
        ({"items-%(batch_time)s.jl": {"format": "jsonlines", "overwrite": True}}, False),
        (
            {"items-%(batch_id)d.jl": {"format": "jsonlines", "overwrite": True}},
            True,
        ),  # batch 1 again at a start
    ],
)
def test_a_local_feed_opened_with_overwrite_is_named_at_start(caplog, feeds, warned):
    """A QA run: two workers started as README says (the same command), each with
    ``-O items.jl``: the second emptied the file the first was writing, and 1,000 of the
    crawl's 2,000 items were missing from it (3 lines cut), their pages acked; nothing said
    so. With the add-on (its feeds written through) as without it."""
    import logging

    from scrapy import Spider
    from scrapy.utils.test import get_crawler

    crawler = get_crawler(Spider, {"ADDONS": {"scrapy_ha.Addon": 0}, "FEEDS": feeds})
    with caplog.at_level(logging.WARNING):
        crawler._apply_settings()  # (the add-on sets FEED_STORAGES there)
        from scrapy_ha.scheduler.shell import Scheduler

        Scheduler.from_crawler(crawler)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    said = [line for line in lines if "overwrite (-O)" in line]
    assert bool(said) is warned, lines
    if warned:
        assert str(next(iter(feeds))) in said[0] and "append (-o)" in said[0]


def test_the_addon_writes_feeds_through_so_no_feed_is_named(caplog):
    import logging

    from scrapy import Spider
    from scrapy.utils.test import get_crawler

    given = {"ADDONS": {"scrapy_ha.Addon": 0}, "FEEDS": {"items.jl": {"format": "jsonlines"}}}
    crawler = get_crawler(Spider, given)
    with caplog.at_level(logging.WARNING):
        crawler._apply_settings()  # (the add-on sets FEED_STORAGES there)
        from scrapy_ha.scheduler.shell import Scheduler

        Scheduler.from_crawler(crawler)
    assert crawler.settings.getwithbase("FEED_STORAGES")[""].endswith(
        "WrittenThroughFileFeedStorage"
    )
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert not [line for line in lines if "FileFeedStorage" in line], lines
