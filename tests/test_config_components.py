"""Every component's settings: a bad value fails at start naming the setting and the value;
a good one lands in the component's frozen config."""

from __future__ import annotations

import dataclasses
import gc
import math
import re
import weakref

import pytest
from scrapy.exceptions import NotConfigured
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from scrapy_ha.config.continuous import RevisitConfig
from scrapy_ha.config.middlewares import (
    CheckpointConfig,
    CookiesConfig,
    ProxyConfig,
    UserAgentConfig,
)
from scrapy_ha.config.retry import RetryConfig
from scrapy_ha.config.scheduler import DeadLetterConfig, SchedulerConfig
from scrapy_ha.config.startup import start_refused
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.middlewares.checkpoint import CheckpointMiddleware
from scrapy_ha.middlewares.cookies import SharedCookiesMiddleware
from scrapy_ha.middlewares.proxy import ProxyMiddleware
from scrapy_ha.middlewares.retry import RetryMiddleware
from scrapy_ha.verdict import FailureClass

DEFAULTS = Settings()
DEFAULTS.setmodule("scrapy.settings.default_settings")


def settings(**values: object) -> Settings:
    s = DEFAULTS.copy()
    s.update(values)
    return s


POOL = {"HA_PROXY_MODE": "pool", "HA_PROXY_POOL_URL": "http://api.example/list"}
#: Checkpoints switched on (switched off, their other settings are not read).
ON = {"HA_CHECKPOINTS": True}
TUNNEL = {"HA_PROXY_MODE": "tunnel", "HA_PROXY_URL": "http://u:secret@proxy.example:8000"}


def HOST_PORT(host: str, port: str) -> dict[str, str]:  # noqa: N802 - reads as the tables
    return {"HA_PROXY_MODE": "tunnel", "HA_PROXY_HOST": host, "HA_PROXY_PORT": port}


BAD = [
    # (config class, settings, text the error must hold)
    (CheckpointConfig, {**ON, "HA_CHECKPOINT_ITEMS": -5}, "HA_CHECKPOINT_ITEMS=-5 must be a whole"),
    (CheckpointConfig, {**ON, "HA_CHECKPOINT_ITEMS": "many"}, "HA_CHECKPOINT_ITEMS='many'"),
    (CheckpointConfig, {**ON, "HA_CHECKPOINT_MAX_BYTES": 0}, "HA_CHECKPOINT_MAX_BYTES=0 must be"),
    (CheckpointConfig, {**ON, "HA_CHECKPOINT_MAX_BYTES": -1}, "HA_CHECKPOINT_MAX_BYTES=-1"),
    (CheckpointConfig, {**ON, "HA_CHECKPOINT_TTL": -1}, "HA_CHECKPOINT_TTL=-1 must be more than 0"),
    (CheckpointConfig, {**ON, "HA_CHECKPOINT_TTL": "week"}, "HA_CHECKPOINT_TTL='week' is not a"),
    (CheckpointConfig, {**ON, "HA_CHECKPOINT_TTL": "inf"}, "HA_CHECKPOINT_TTL='inf' must be a fin"),
    (CheckpointConfig, {**ON, "HA_CHECKPOINT_TTL": 0.0004}, "HA_CHECKPOINT_TTL=0.0004 must be at"),
    (CheckpointConfig, {**ON, "HA_CHECKPOINT_RERUN": "perhaps"}, "HA_CHECKPOINT_RERUN='perhaps'"),
    (
        CheckpointConfig,
        {**ON, "HA_CHECKPOINT_ID_FIELD": 3},
        "HA_CHECKPOINT_ID_FIELD=3 must be a str",
    ),
    (CheckpointConfig, {"HA_CHECKPOINTS": "sure"}, "HA_CHECKPOINTS='sure' must be True or"),
    (DeadLetterConfig, {"HA_DLQ_MAX_ENTRIES": -1}, "HA_DLQ_MAX_ENTRIES=-1 must be a whole"),
    (DeadLetterConfig, {"HA_DLQ_MAX_ENTRIES": "lots"}, "HA_DLQ_MAX_ENTRIES='lots'"),
    (DeadLetterConfig, {"HA_DLQ_MAX_AGE": -3}, "HA_DLQ_MAX_AGE=-3 must be 0 or more"),
    (DeadLetterConfig, {"HA_DLQ_MAX_AGE": "nan"}, "HA_DLQ_MAX_AGE='nan' is not a number (NaN)"),
    # NaN passed every bound (nan < 0 is false): a cookie jar's TTL of NaN failed every
    # download of the crawl, which ended with 0 items and exit 0
    (CookiesConfig, {"HA_COOKIES_TTL": "nan"}, "HA_COOKIES_TTL='nan' is not a number (NaN)"),
    (RetryConfig, {"HA_RETRY_JITTER": "nan"}, "HA_RETRY_JITTER='nan' is not a number (NaN)"),
    (ProxyConfig, {**POOL, "HA_PROXY_COOLDOWN": "nan"}, "HA_PROXY_COOLDOWN='nan' is not a"),
    # Redis refused every checkpoint's expiry (the crawl went on, each checkpoint dropped)
    (
        CheckpointConfig,
        {**ON, "HA_CHECKPOINT_TTL": "1e15"},
        "HA_CHECKPOINT_TTL='1e15' must be more than 0 seconds (at most 1e+09)",
    ),
    (DeadLetterConfig, {"HA_DLQ_WARN_THRESHOLD": 1.5}, "HA_DLQ_WARN_THRESHOLD=1.5"),
    (CookiesConfig, {"HA_SHARED_COOKIES": "yes please"}, "HA_SHARED_COOKIES='yes please'"),
    (UserAgentConfig, {"HA_USER_AGENTS": ["", "x"]}, "HA_USER_AGENTS=['', 'x'] must be a list"),
    (RetryConfig, {"HA_RETRY_ENABLED": "on?"}, "HA_RETRY_ENABLED='on?' must be True or False"),
    (RetryConfig, {"HA_RETRY_TIMES": -1}, "HA_RETRY_TIMES=-1 must be a whole number of 0"),
    (RetryConfig, {"HA_RETRY_BACKOFF_MAX": -1}, "HA_RETRY_BACKOFF_MAX=-1 must be 0 or more"),
    (RetryConfig, {"HA_RETRY_AFTER_MAX": "x"}, "HA_RETRY_AFTER_MAX='x' is not a number"),
    (RetryConfig, {"HA_RETRY_JITTER": 2}, "HA_RETRY_JITTER=2.0 must be between 0 and 1"),
    (RetryConfig, {"HA_RETRY_STATUS_CLASSES": {599: "lost"}}, "[599]='lost' is not a failure"),
    (RetryConfig, {"HA_BAN_CHECK": "os.sep"}, "HA_BAN_CHECK='os.sep' is not callable"),
    (ProxyConfig, {"HA_PROXY_MODE": "rotate"}, "HA_PROXY_MODE='rotate' must be 'tunnel'"),
    (ProxyConfig, {"HA_PROXY_MODE": "pool"}, "HA_PROXY_MODE='pool' needs HA_PROXY_POOL_URL"),
    (ProxyConfig, {**POOL, "HA_PROXY_POOL_URL": "api.example/x"}, "HA_PROXY_POOL_URL='api"),
    (ProxyConfig, {**POOL, "HA_PROXY_POOL_TTL": -1}, "HA_PROXY_POOL_TTL=-1 must be 0 or more"),
    (ProxyConfig, {**POOL, "HA_PROXY_POOL_PARSER": "no.such.f"}, "HA_PROXY_POOL_PARSER='no.s"),
    (ProxyConfig, {**POOL, "HA_PROXY_POOL_PARSER": "os.sep"}, "HA_PROXY_POOL_PARSER='os.sep'"),
    (ProxyConfig, {**POOL, "HA_PROXY_COOLDOWN": "long"}, "HA_PROXY_COOLDOWN='long' is not a"),
    (ProxyConfig, {**POOL, "HA_PROXY_MAX_FAILURES": 0}, "HA_PROXY_MAX_FAILURES=0 must be a"),
    (ProxyConfig, {**POOL, "HA_PROXY_ALLOW_DIRECT": "maybe"}, "HA_PROXY_ALLOW_DIRECT='maybe'"),
    (ProxyConfig, {"HA_PROXY_MODE": "tunnel"}, "HA_PROXY_MODE='tunnel' needs HA_PROXY_URL"),
    (ProxyConfig, {**TUNNEL, "HA_PROXY_URL": "http://u:pw@h:port"}, "needs a host and a port"),
    (ProxyConfig, {**TUNNEL, "HA_PROXY_URL": "http://u:pw@h:99999"}, "needs a host and a port"),
    (ProxyConfig, {**TUNNEL, "HA_PROXY_URL": "socks5://u:pw@h:1080"}, "must be an http:// or"),
    (ProxyConfig, {**TUNNEL, "HA_PROXY_URL": "ftp://u:pw@h:21"}, "no ftp://"),
    (ProxyConfig, HOST_PORT("h", "80a"), "HA_PROXY_PORT='80a' must be a port number from 1"),
    (ProxyConfig, HOST_PORT("h", "99999"), "HA_PROXY_PORT='99999' must be a port number"),
    (ProxyConfig, HOST_PORT("h", "0"), "HA_PROXY_PORT='0' must be a port number"),
    (ProxyConfig, HOST_PORT("http://h", "80"), "HA_PROXY_HOST='http://h' must be a host"),
    (ProxyConfig, {**POOL, "HA_PROXY_POOL_URL": "ftp://a/x"}, "http://, https:// or file://"),
    # a host Python cannot read: before, a ValueError's traceback with no setting named
    (ProxyConfig, {**TUNNEL, "HA_PROXY_URL": "http://[::1:8000"}, "HA_PROXY_URL='http://[::1"),
    (ProxyConfig, {**TUNNEL, "HA_PROXY_URL": "http://[zz]:80"}, "its host cannot be read"),
    (ProxyConfig, {**POOL, "HA_PROXY_POOL_URL": "http://[::1/x"}, "HA_PROXY_POOL_URL='http"),
    (ProxyConfig, {**TUNNEL, "HA_PROXY_SESSION_TEMPLATE": "{user}"}, "must contain {session}"),
    (ProxyConfig, {**TUNNEL, "HA_PROXY_SESSION_TEMPLATE": "{x}{session}"}, "TEMPLATE='{x}"),
    (ProxyConfig, {**TUNNEL, "HA_PROXY_ROTATE_HEADER": "X-Rotate"}, "must look like 'Name: v"),
]


@pytest.mark.parametrize(("config", "values", "message"), BAD)
def test_a_bad_setting_names_itself_and_its_value(config, values, message, monkeypatch):
    for name in ("HA_PROXY_MODE", "HA_PROXY_URL", "HA_PROXY_POOL_URL", "HA_PROXY_HOST"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError) as info:
        config.from_settings(settings(**values))
    assert message in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "http://u:pw@h:x",
        "http://crawler:Xk/9#s3cret@proxy.example:8000",
        "http://crawler:Ab?Cd#s3cret@proxy.example:8000",
        "http://crawler:pa#s3cret@proxy.example:8000",
        "socks5://crawler:s3cret@proxy.example:1080",
        # a password of digits then '/': read as a port and a path, never masked (review)
        "http://crawler:1234/s3cret@proxy.example:8000",
        "http://crawler:99#s3cret@proxy.example:3128",
        # and a host that cannot be read after it (review)
        "http://crawler:12/s3cret@[::1:8000",
        "http://crawler:pw@[::1:8000",
        "crawler:pa[s3cret@proxy:8000",  # no scheme: masked all the same (review)
    ],
)
def test_no_error_shows_a_proxy_password(url, monkeypatch):
    for name in ("HA_PROXY_USER", "HA_PROXY_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError) as info:
        ProxyConfig.from_settings(settings(HA_PROXY_MODE="tunnel", HA_PROXY_URL=url))
    assert "HA_PROXY_URL" in str(info.value)
    assert "pw" not in str(info.value) and "s3cret" not in str(info.value)
    assert "1234" not in str(info.value)


GOOD = [
    # (config class, settings, fields expected)
    (CheckpointConfig, {}, {"enabled": False, "every_items": 50, "max_bytes": 2048}),
    (CheckpointConfig, {"HA_CHECKPOINTS": True, "HA_CHECKPOINT_ITEMS": 0}, {"every_items": 0}),
    (
        CheckpointConfig,
        {**ON, "HA_CHECKPOINT_TTL": 60, "HA_CHECKPOINT_ID_FIELD": "sku"},
        {"ttl": 60},
    ),
    (CheckpointConfig, {**ON, "HA_CHECKPOINT_RERUN": "True"}, {"rerun": True, "id_field": "id"}),
    (DeadLetterConfig, {}, {"max_entries": 100_000, "max_age": 30 * 86400.0}),
    (DeadLetterConfig, {"HA_DLQ_MAX_AGE": 60, "HA_DLQ_WARN_THRESHOLD": "5"}, {"warn_threshold": 5}),
    (DeadLetterConfig, {"HA_DLQ_MAX_ENTRIES": 0, "HA_DLQ_MAX_AGE": 0}, {"max_entries": 0}),
    # inf: no age limit (before: int(inf * 1000) failed every dead letter and reclaim)
    (DeadLetterConfig, {"HA_DLQ_MAX_AGE": "inf"}, {"max_age": math.inf, "max_age_ms": 2**53}),
    (DeadLetterConfig, {"HA_DLQ_MAX_AGE": 1e306}, {"max_age": 1e306, "max_age_ms": 2**53}),
    (SchedulerConfig, {"CONCURRENT_REQUESTS": 0}, {"prefetch": 16}),  # 0: no limit in Scrapy
    (CookiesConfig, {}, {"enabled": True, "debug": False, "shared": True}),
    (CookiesConfig, {"HA_SHARED_COOKIES": False, "COOKIES_DEBUG": True}, {"shared": False}),
    (UserAgentConfig, {}, {"agents": ()}),
    (UserAgentConfig, {"HA_USER_AGENTS": ["A", "B"]}, {"agents": ("A", "B")}),
    (RetryConfig, {}, {"enabled": True, "jitter": 1.0, "retry_after_max": 600.0}),
    (
        RetryConfig,
        {"HA_RETRY_ENABLED": False, "HTTPERROR_ALLOWED_CODES": [404]},
        {"enabled": False},
    ),
    (RetryConfig, {"HTTPERROR_ALLOWED_CODES": ["404"]}, {"allowed_codes": (404,)}),
    (ProxyConfig, POOL, {"mode": "pool", "pool_ttl": 30.0, "cooldown": 300.0, "max_failures": 2}),
    (ProxyConfig, {**POOL, "HA_PROXY_POOL_TTL": 0, "HA_PROXY_ALLOW_DIRECT": "1"}, {"pool_ttl": 0}),
    (ProxyConfig, {**TUNNEL, "HA_PROXY_ROTATE_HEADER": "X-R: 1"}, {"rotate_header": ("X-R", "1")}),
    (ProxyConfig, HOST_PORT("proxy.example", "65535"), {"url": "http://proxy.example:65535"}),
    (
        ProxyConfig,
        {**TUNNEL, "HA_PROXY_URL": "https://p.example:443"},
        {"url": "https://p.example:443"},
    ),
    (ProxyConfig, {**POOL, "HA_PROXY_POOL_URL": "file:///etc/p.json"}, {"mode": "pool"}),
    (  # a review: an '@' then a comma in the query read as a list of hosts, and refused
        ProxyConfig,
        {**POOL, "HA_PROXY_POOL_URL": "https://api.example:8443/p?emails=a@b,c"},
        {"mode": "pool"},
    ),
    (ProxyConfig, TUNNEL, {"url": "http://u:secret@proxy.example:8000", "session_template": ""}),
    (SchedulerConfig, {}, {"worker_id_given": False, "feed_given": False, "feed": False}),
    (SchedulerConfig, {"HA_WORKER_ID": "w1"}, {"worker_id": "w1", "worker_id_given": True}),
    (SchedulerConfig, {"HA_FEED": False}, {"feed": False, "feed_given": True}),
]


@pytest.mark.parametrize(("config", "values", "fields"), GOOD)
def test_settings_land_in_the_config(config, values, fields, monkeypatch):
    for name in ("HA_PROXY_MODE", "HA_PROXY_URL", "HA_PROXY_POOL_URL", "HA_PROXY_HOST"):
        monkeypatch.delenv(name, raising=False)
    read = config.from_settings(settings(**values))
    assert {name: getattr(read, name) for name in fields} == fields
    with pytest.raises(dataclasses.FrozenInstanceError):
        read.__setattr__(next(iter(fields)), None)


def test_proxy_config_is_none_without_a_mode(monkeypatch):
    monkeypatch.delenv("HA_PROXY_MODE", raising=False)
    assert ProxyConfig.from_settings(settings()) is None


def test_a_retry_policy_override_changes_that_class_only():
    config = RetryConfig.from_settings(settings(HA_RETRY_POLICIES={"server": {"times": 9}}))
    assert config.policies[FailureClass.SERVER].times == 9
    assert config.policies[FailureClass.BANNED].times == 3
    assert config.status_classes[404] is FailureClass.GONE


def test_the_checkpoint_middleware_refuses_a_negative_item_count(caplog):
    """HA_CHECKPOINT_ITEMS=-5 used to be taken as is (and checkpoint nothing mid-page). The
    middleware is left out and the crawl's start refused, in one ERROR line (before: the
    ConfigError raised through Scrapy's engine, a traceback)."""
    crawler = get_crawler(settings_dict={"HA_CHECKPOINTS": True, "HA_CHECKPOINT_ITEMS": -5})
    with pytest.raises(NotConfigured):
        CheckpointMiddleware.from_crawler(crawler)
    assert start_refused(crawler)
    assert "scrapy-ha cannot start: HA_CHECKPOINT_ITEMS=-5 must be a whole" in caplog.text


def test_the_proxy_middleware_refuses_a_negative_cooldown(caplog):
    """HA_PROXY_COOLDOWN=-1 used to be taken as is (a proxy never cooled down)."""
    crawler = get_crawler(settings_dict={**POOL, "HA_PROXY_COOLDOWN": -1})
    with pytest.raises(NotConfigured):
        ProxyMiddleware.from_crawler(crawler)
    assert start_refused(crawler) and "HA_PROXY_COOLDOWN=-1 must be 0 or more" in caplog.text


@pytest.mark.parametrize(
    ("middleware", "values"),
    [
        (CheckpointMiddleware, {"HA_CHECKPOINT_TTL": 0, "HA_CHECKPOINT_ITEMS": -5}),
        (RetryMiddleware, {"HA_RETRY_ENABLED": False, "HA_RETRY_JITTER": 2}),
        (SharedCookiesMiddleware, {"COOKIES_ENABLED": False, "HA_SHARED_COOKIES": "maybe"}),
    ],
)
def test_a_component_switched_off_does_not_read_the_settings_it_would_use(middleware, values):
    """As Scrapy's own: switched off, it is not configured, whatever its other settings say
    (the add-on installs the checkpoint middleware in every crawl)."""
    with pytest.raises(NotConfigured):
        middleware.from_crawler(get_crawler(settings_dict=values))


@pytest.mark.parametrize(
    "proxy",
    [
        {"HA_PROXY_URL": "http://u:p@[::1]:8080"},
        {"HA_PROXY_HOST": "::1", "HA_PROXY_PORT": 8080},
        {"HA_PROXY_HOST": "[::1]", "HA_PROXY_PORT": 8080},
    ],
)
def test_an_ipv6_tunnel_proxy_keeps_its_brackets(proxy, monkeypatch):
    """Review: ``http://[::1]:8080`` became ``http://::1:8080`` (the URL's hostname drops
    the brackets), which failed every request; a bare ``::1`` was refused."""
    from scrapy_ha.middlewares.proxy_sources import TunnelProxy  # noqa: PLC0415

    for name in ("HA_PROXY_USER", "HA_PROXY_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    config = ProxyConfig.from_settings(settings(HA_PROXY_MODE="tunnel", **proxy))
    assert config is not None
    assert TunnelProxy(config).url().endswith("[::1]:8080")


def test_a_pool_url_whose_password_reads_as_a_port_is_refused_unshown(monkeypatch):
    """Review: ``http://apiuser:1234/Zq@host/list`` connected to the host ``apiuser`` and
    logged the URL, password and all (masking reads ``1234`` as a port). A password the
    masking reads (``pa/ss``) is taken: it is sent as Basic auth."""
    monkeypatch.delenv("HA_PROXY_POOL_URL", raising=False)
    url = "http://apiuser:1234/Zq@127.0.0.1:9/list"
    with pytest.raises(ConfigError, match="HA_PROXY_POOL_URL has an '@' after its host") as info:
        ProxyConfig.from_settings(settings(HA_PROXY_MODE="pool", HA_PROXY_POOL_URL=url))
    assert "1234" not in str(info.value) and "Zq" not in str(info.value)
    good = "http://apiuser:pa/ss@127.0.0.1:9/list"
    config = ProxyConfig.from_settings(settings(HA_PROXY_MODE="pool", HA_PROXY_POOL_URL=good))
    assert config is not None


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("HTTPERROR_ALLOWED_CODES", "abc", "HTTPERROR_ALLOWED_CODES='abc' must be HTTP status"),
        ("HA_RETRY_POLICIES", "notjson", "HA_RETRY_POLICIES='notjson' must be a dict"),
        ("HA_RETRY_STATUS_CLASSES", '{"x": "server"}', "HA_RETRY_STATUS_CLASSES['x']: not an"),
    ],
)
def test_a_setting_scrapy_cannot_parse_is_a_config_error_naming_it(name, value, said):
    """Before: Scrapy's ValueError (``int('abc')``, a JSONDecodeError), which no component
    said in one line: the crawl's start printed a traceback."""
    with pytest.raises(ConfigError, match=re.escape(said)):
        RetryConfig.from_settings(settings(**{name: value}))


def test_revisit_rules_scrapy_cannot_parse_are_a_config_error():
    with pytest.raises(ConfigError, match="HA_REVISIT='{not json' must be a dict"):
        RevisitConfig.from_settings(settings(HA_REVISIT="{not json"))


def test_a_crawler_refused_at_start_is_not_kept_alive():
    """The refusal kept for each crawler held that crawler (a service that runs crawls for
    good kept every one refused)."""
    crawler = get_crawler(settings_dict={"HA_CHECKPOINTS": True, "HA_CHECKPOINT_ITEMS": -5})
    with pytest.raises(NotConfigured):
        CheckpointMiddleware.from_crawler(crawler)
    gone = weakref.ref(crawler)
    del crawler
    gc.collect()
    assert gone() is None
