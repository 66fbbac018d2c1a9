"""Whoever can write to Redis must not make a worker read its own files: requests read from
Redis (queued, pushed, resumed from a checkpoint) and requests a spider queues have a
scheme of HA_ALLOWED_SCHEMES (http and https by default). Real crawls, a real
redis-server, the real ``scrapy-ha`` command."""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any

import pytest
import scrapy
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.codec import Refused, decode_request, refused_scheme
from scrapy_ha.config.scheduler import ConfigError, SchedulerConfig
from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.admission import Admission
from tests import backqueues
from tests.cli_seed import scrapy_ha

KEYS = Keys("ha", "schemes")
#: What a Redis writer would have a worker read: its environment holds REDIS_URL.
ENVIRON = "file:///proc/self/environ"
FOREIGN = [ENVIRON, "data:,secret", "ftp://127.0.0.1:9/x", "s3://bucket/key"]


class SchemesSpider(scrapy.Spider):
    """Fetches ``urls`` (spider argument); records what its callback was handed."""

    name = "schemes"

    def __init__(self, urls: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.urls = urls
        self.seen: list[tuple[str, bytes]] = []

    async def start(self) -> Any:
        for url in self.urls:
            yield scrapy.Request(url, meta={"ha_task": "t1"} if "/list/" in url else {})

    def parse(self, response: Any) -> None:
        self.seen.append((response.url, response.body))


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


def settings(redis_url: str, **extra: Any) -> dict[str, Any]:
    return {
        "SCHEDULER": "scrapy_ha.Scheduler",
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.3,
        "SCHEDULER_PERSIST": True,
        **extra,
    }


def stored(url: str) -> bytes:
    """A request for *url* to the spider's parse, as a Redis writer would store it."""
    return json.dumps({"v": 1, "u": url, "cb": "parse"}).encode()


def plant(redis_client, urls: list[str]) -> dict[str, str]:
    """Pending entries for *urls*, by entry id."""
    ids = {str(n): url for n, url in enumerate(urls, 900)}
    backqueues.plant(redis_client, KEYS, [(n, stored(url)) for n, url in ids.items()])
    return ids


# -- the setting ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (["http", "file://"], "'file://' is not a URL scheme"),
        ([], "must be a non-empty list of URL schemes"),
        (5, "must be a non-empty list of URL schemes"),
        (["http", ""], "'' is not a URL scheme"),
    ],
)
def test_a_bad_value_names_the_setting_and_the_value(value, says):
    with pytest.raises(ConfigError, match=re.escape(f"HA_ALLOWED_SCHEMES={value!r}") + ".*" + says):
        SchedulerConfig.from_settings(Settings({"HA_ALLOWED_SCHEMES": value}))


def test_the_setting_defaults_to_the_web_and_takes_a_command_line_list():
    assert SchedulerConfig.from_settings(Settings()).allowed_schemes == {"http", "https"}
    given = Settings({"HA_ALLOWED_SCHEMES": "http, https,FILE"})
    assert SchedulerConfig.from_settings(given).allowed_schemes == {"http", "https", "file"}


# -- reading a stored request ----------------------------------------------------------


@pytest.mark.parametrize("url", [*FOREIGN, "FILE:///etc/passwd"])
def test_a_stored_request_of_another_scheme_is_refused(url):
    scheme = url.split(":")[0].lower()
    with pytest.raises(
        Refused, match=rf"scheme '{scheme}', which HA_ALLOWED_SCHEMES \(http, https\)"
    ):
        decode_request(stored(url), SchemesSpider())
    allowed = decode_request(stored(url), SchemesSpider(), schemes={"http", scheme})
    assert allowed.url.lower() == url.lower()


@deferred_f_from_coro_f
async def test_requests_of_other_schemes_in_redis_are_dead_lettered_unread(
    redis_url, redis_client, site
):
    ids = plant(redis_client, [*FOREIGN, site.url + "/item/1"])
    crawler = get_crawler(SchemesSpider, settings(redis_url))
    await crawler.crawl_async()
    assert [url for url, _ in crawler.spider.seen] == [site.url + "/item/1"]
    assert crawler.stats.get_value("ha/dead/refused") == len(FOREIGN)
    dead = {k.decode(): json.loads(v) for k, v in redis_client.hgetall(KEYS.dead_info).items()}
    assert {ids[k] for k in dead} == set(FOREIGN)
    for entry_id, info in dead.items():
        scheme = ids[entry_id].split(":")[0]
        assert info["class"] == "refused"
        assert f"scheme '{scheme}', which HA_ALLOWED_SCHEMES (http, https)" in info["reason"]
    # a spider that crawls file:// on purpose says so; then workers read them from Redis
    redis_client.delete(*redis_client.keys("ha:{schemes}:*"))
    plant(redis_client, [ENVIRON])
    crawler = get_crawler(SchemesSpider, settings(redis_url, HA_ALLOWED_SCHEMES=["https", "file"]))
    await crawler.crawl_async()
    assert [url for url, _ in crawler.spider.seen] == [ENVIRON]


# -- what the spider queues ----------------------------------------------------------


@pytest.mark.parametrize(
    "schemes", [frozenset({"http", "https"}), frozenset({"http", "file", "git+ssh", "S3", ""})]
)
@pytest.mark.parametrize(
    "url",
    [
        "http://a.test/x",
        "https://a.test/x",
        "HTTP://a.test/x",
        "http:/a.test",
        "file:///etc/passwd",
        "git+ssh://a.test/r",
        "s3://bucket/key",
        "S3://bucket/key",
        "data:,http://a.test/",
        "httpx://a.test/",
        ENVIRON,
    ],
)
def test_the_admissions_quick_test_of_a_scheme_answers_as_the_codecs_rule(schemes, url):
    """The scheduler allows a URL that starts with an allowed scheme and a colon without
    parsing it (per request); whatever the URL, it answers as ``refused_scheme``."""
    crawler = get_crawler(scrapy.Spider)
    crawler.stats.open_spider()
    admission = Admission(
        crawler, dedupe=True, dedupe_start=True, debug=False, unstorable="error", schemes=schemes
    )
    request = scrapy.Request(url)
    assert admission.refuses_scheme(request) == (refused_scheme(request, schemes) is not None)


@deferred_f_from_coro_f
async def test_a_spider_request_of_another_scheme_is_not_queued_unless_allowed(
    redis_url, redis_client, site, tmp_path, caplog
):
    page = tmp_path / "page.html"
    page.write_text("local page")
    urls = (page.as_uri(), site.url + "/item/1")
    crawler = get_crawler(SchemesSpider, settings(redis_url))
    with caplog.at_level(logging.WARNING):
        await crawler.crawl_async(urls=urls)
    assert [url for url, _ in crawler.spider.seen] == [site.url + "/item/1"]
    assert crawler.stats.get_value("ha/scheme_refused") == 1
    assert f"Not queued: the request for {page.as_uri()} has the scheme 'file'" in caplog.text
    assert "add 'file' to it" in caplog.text
    # allowed, it is queued, and read back from Redis as any other
    redis_client.delete(*redis_client.keys("ha:{schemes}:*"))
    allowed = settings(redis_url, HA_ALLOWED_SCHEMES="http,https,file")
    crawler = get_crawler(SchemesSpider, allowed)
    await crawler.crawl_async(urls=urls)
    seen = dict(crawler.spider.seen)
    assert sorted(seen) == sorted(urls) and seen[page.as_uri()] == b"local page"


@deferred_f_from_coro_f
async def test_a_checkpoint_that_resumes_at_another_scheme_starts_over(
    redis_url, redis_client, site, caplog
):
    doc = {"task": "t1", "page": 3, "items": 20, "next": stored(ENVIRON).decode()}
    redis_client.set(KEYS.checkpoint("t1"), json.dumps(doc))
    extra = {
        "HA_CHECKPOINTS": True,
        "SPIDER_MIDDLEWARES": {"scrapy_ha.checkpoint.CheckpointMiddleware": 900},
    }
    crawler = get_crawler(SchemesSpider, settings(redis_url, **extra))
    with caplog.at_level(logging.WARNING):
        await crawler.crawl_async(urls=(site.url + "/list/1",))
    assert [url for url, _ in crawler.spider.seen] == [site.url + "/list/1"]
    assert "Checkpoint of task t1 is unreadable" in caplog.text
    assert "scheme 'file', which HA_ALLOWED_SCHEMES" in caplog.text


# -- scrapy-ha push ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "url"),
    [
        (ENVIRON, ENVIRON),
        (json.dumps({"url": "data:,secret", "callback": "parse"}), "data:,secret"),
    ],
)
def test_push_refuses_another_scheme_and_pushes_nothing(redis_url, redis_client, request_, url):
    result = scrapy_ha(
        "push", "schemes", "--create", "http://a.example/", request_, "--redis-url", redis_url
    )
    assert result.returncode == 1
    refused = [line for line in result.stderr.splitlines() if line.startswith("nothing pushed")]
    assert refused and refused[0].startswith(
        f"nothing pushed: argument 2: the request for {url} has the scheme "
        f"'{url.split(':')[0]}', which HA_ALLOWED_SCHEMES (http, https) does not allow"
    ), result.stderr
    assert not redis_client.keys("ha:{schemes}:*")


def test_push_follows_the_projects_setting(redis_url, redis_client, tmp_path):
    (tmp_path / "schemes_settings.py").write_text('HA_ALLOWED_SCHEMES = ["https", "file"]\n')
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "SCRAPY_SETTINGS_MODULE": "schemes_settings"}
    result = scrapy_ha("push", "schemes", "--create", ENVIRON, "--redis-url", redis_url, env=env)
    assert result.returncode == 0, result.stderr
    assert len(backqueues.pending(redis_client, KEYS)) == 1
    result = scrapy_ha(
        "push", "schemes", "--create", "http://a.example/", "--redis-url", redis_url, env=env
    )
    assert result.returncode == 1
    assert "which HA_ALLOWED_SCHEMES (file, https) does not allow" in result.stderr
    (tmp_path / "schemes_settings.py").write_text('HA_ALLOWED_SCHEMES = ["file://"]\n')
    result = scrapy_ha("push", "schemes", "--create", ENVIRON, "--redis-url", redis_url, env=env)
    assert result.returncode == 2
    assert "HA_ALLOWED_SCHEMES=['file://']: 'file://' is not a URL scheme" in result.stderr
