"""``scrapy-ha push`` run in a project gives a request what a worker of that project gives it:
the fingerprint of its REQUEST_FINGERPRINTER_CLASS, the shard of that fingerprint (with the
spider's own HA_SHARDS), its DUPEFILTER_CLASS and the codec's reading of its settings
(a Cookie header kept when COOKIES_ENABLED is off). Real ``scrapy crawl`` workers of the same
project crawl what was pushed, each page once."""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Any

import pytest

from scrapy_ha.codec import decode_request
from scrapy_ha.keys import Keys, shard_of
from tests import backqueues
from tests.cli_seed import scrapy_ha
from tests.scrapy_project import crawl, write_project

if TYPE_CHECKING:
    from pathlib import Path

PROJECT = "pushproj"
SPIDERS = """
import hashlib
from urllib.parse import urlsplit

import scrapy


class PathFingerprinter:
    \"\"\"Requests that differ only in their query string are the same page.\"\"\"

    def fingerprint(self, request):
        return hashlib.sha1(urlsplit(request.url).path.encode()).digest()


class Pushed(scrapy.Spider):
    name = "pushed"

    def __init__(self, base_url="", **kwargs):
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/list/1"]

    def parse(self, response):
        for href in response.css("a.item::attr(href)").getall():
            yield response.follow(href, callback=self.parse_item)

    def parse_item(self, response):
        yield {"url": response.url}


class Sharded(Pushed):
    name = "sharded"
    custom_settings = {"HA_SHARDS": 3}


class Unfiltered(Pushed):
    name = "unfiltered"
    custom_settings = {"DUPEFILTER_CLASS": "scrapy.dupefilters.BaseDupeFilter"}


class Fifo(Pushed):
    name = "fifo"
    custom_settings = {"HA_QUEUE_ORDER": "fifo"}
"""
SETTINGS = f"""
REQUEST_FINGERPRINTER_CLASS = "{PROJECT}.spiders.spiders.PathFingerprinter"
COOKIES_ENABLED = False
"""
FAST = {"HA_IDLE_TIMEOUT": "1", "HA_LEASE_TIME": "3", "HA_LEASE_RENEW_INTERVAL": "1"}
#: Seconds a worker gets to crawl a list page and a dozen items on a loaded machine.
PATIENCE = 120


def _project(tmp_path: Path) -> Path:
    return write_project(tmp_path / "project", PROJECT, SPIDERS, SETTINGS)


def _push(project: Path, redis_url: str, spider: str, *requests: str) -> Any:
    return scrapy_ha("push", spider, *requests, "--create", "--redis-url", redis_url, cwd=project)


def _crawl(project: Path, spider: str, site_url: str, redis_url: str, log: Path) -> None:
    worker = crawl(
        project,
        spider,
        log,
        args={"base_url": site_url},
        settings={**FAST, "REDIS_URL": redis_url},
    )
    assert worker.wait(timeout=PATIENCE) == 0, log.read_text()[-3000:]


def _hits_by_path(hits: dict[str, int]) -> dict[str, int]:
    """The site counts each URI: add up those of one path (query strings apart)."""
    paths: dict[str, int] = {}
    for uri, n in hits.items():
        path = uri.partition("?")[0]
        paths[path] = paths.get(path, 0) + n
    return paths


def _pending_urls(redis_client: Any, keys: Keys) -> set[str]:
    return {decode_request(p, None).url for _, p in backqueues.pending(redis_client, keys)}


def test_push_filters_with_the_projects_fingerprinter_and_the_worker_agrees(
    tmp_path, redis_url, site
):
    project = _project(tmp_path)
    pushed = _push(
        project, redis_url, "pushed", f"{site.url}/item/1?from=cli", f"{site.url}/item/1?from=again"
    )
    assert pushed.returncode == 0, pushed.stderr
    assert pushed.stdout.strip() == "pushed 2 requests to pushed: 1 added, 1 filtered (seen before)"
    assert pushed.stderr == ""
    # the worker's /list/1 yields /item/1 to /item/10: /item/1 is the page pushed already
    _crawl(project, "pushed", site.url, redis_url, tmp_path / "worker.log")
    paths = _hits_by_path(site.hits())
    assert {f"/item/{i}": paths.get(f"/item/{i}") for i in range(1, 11)} == {
        f"/item/{i}": 1 for i in range(1, 11)
    }


def test_push_places_requests_in_the_shards_a_worker_of_the_spider_uses(
    tmp_path, redis_url, redis_client, site_factory
):
    site = site_factory("--pages", "2", "--per-page", "10")
    project = _project(tmp_path)
    urls = [f"{site.url}/item/{i}?from=cli" for i in range(1, 13)]
    pushed = _push(project, redis_url, "sharded", *urls)
    assert pushed.returncode == 0, pushed.stderr
    assert redis_client.get(Keys("ha", "sharded", 0, 3).shard_count) == b"3"  # custom_settings
    expected: dict[int, set[str]] = {0: set(), 1: set(), 2: set()}
    for url in urls:
        path = re.sub(r"^http://[^/]+|\?.*$", "", url)
        expected[shard_of(hashlib.sha1(path.encode()).digest()[:12], 3)].add(url)
    placed = {i: _pending_urls(redis_client, Keys("ha", "sharded", i, 3)) for i in range(3)}
    assert placed == expected
    # the worker filters its /item/1 to /item/10 in the shards the pushed pages are in
    _crawl(project, "sharded", site.url, redis_url, tmp_path / "worker.log")
    paths = _hits_by_path(site.hits())
    assert {f"/item/{i}": paths.get(f"/item/{i}") for i in range(1, 13)} == {
        f"/item/{i}": 1 for i in range(1, 13)
    }


def test_push_reads_the_dupefilter_and_the_codec_settings_a_worker_reads(
    tmp_path, redis_url, redis_client
):
    project = _project(tmp_path)
    line = '{"url": "http://a.example/item/1", "headers": {"Cookie": "sid=spiders-own"}}'
    pushed = _push(project, redis_url, "unfiltered", line, line)
    assert pushed.returncode == 0, pushed.stderr
    # DUPEFILTER_CLASS = BaseDupeFilter (the spider's): a worker filters nothing
    assert (
        pushed.stdout.strip()
        == "pushed 2 requests to unfiltered: 2 added, 0 filtered (seen before)"
    )
    members = backqueues.pending(redis_client, Keys("ha", "unfiltered"))
    assert len(members) == 2
    for _, member in members:
        # COOKIES_ENABLED = False: the Cookie header is the spider's own, no jar replaces it
        request = decode_request(member, None)
        assert request.headers.get("Cookie") == b"sid=spiders-own"


@pytest.mark.parametrize(("spider", "newest_first"), [("pushed", True), ("fifo", False)])
def test_push_places_requests_in_the_order_of_the_spiders_workers(
    tmp_path, redis_url, redis_client, spider, newest_first
):
    """Scrapy's default order within a priority is LIFO: a worker puts its new request at
    the head of its back queue, scored as the first of its priority. A push placed its
    requests in FIFO order whatever the project's, at the tail of a LIFO crawl's back
    queue (a QA run: a request pushed mid-crawl waited behind 150 older ones)."""
    project = _project(tmp_path)
    urls = [f"http://a.example/item/{i}" for i in range(1, 4)]
    for url in urls:  # one push each, as an operator adds them over time
        assert _push(project, redis_url, spider, url).returncode == 0
    keys = Keys("ha", spider)
    assert backqueues.qids(redis_client, keys) == ["0:a.example"]
    queued = [decode_request(p, None).url for _, p in backqueues.pending(redis_client, keys)]
    assert queued == (urls[::-1] if newest_first else urls)
    ids = [int(i) for i, _ in backqueues.pending(redis_client, keys)]
    place = 2**39 - ids[0] if newest_first else ids[0]  # lib/priority place_of
    assert redis_client.zscore(keys.ready, "0:a.example") == place


def test_push_outside_a_project_says_whose_settings_it_used(tmp_path, redis_url):
    pushed = scrapy_ha(
        "push", "pushed", "http://a.example/", "--create", "--redis-url", redis_url, cwd=tmp_path
    )
    assert pushed.returncode == 0, pushed.stderr
    assert "not in a Scrapy project" in pushed.stderr
    assert "Scrapy's defaults" in pushed.stderr


def test_a_callback_the_spider_does_not_have_is_refused_in_its_project(redis_url, tmp_path):
    """It was pushed ("1 added"), and the worker dead-lettered it as corrupt."""
    project = _project(tmp_path)
    bad = '{"url": "http://a.example/1", "callback": "nosuchmethod"}'
    refused = _push(project, redis_url, "pushed", bad)
    assert refused.returncode == 1, refused.stderr
    assert "nothing pushed: argument 1: the spider has no callback method 'nosuchmethod'" in (
        refused.stderr
    )
    machinery = '{"url": "http://a.example/1", "errback": "_set_crawler"}'  # not a callback
    assert _push(project, redis_url, "pushed", machinery).returncode == 1
    good = '{"url": "http://a.example/1", "callback": "parse_item"}'
    assert _push(project, redis_url, "pushed", good).returncode == 0


def test_push_outside_the_project_places_requests_in_the_crawls_order(
    tmp_path, redis_url, redis_client
):
    """Outside the project, push read Scrapy's defaults, LIFO: into a FIFO crawl it put its
    request at the head of its back queue, scored as LIFO, ahead of the requests the workers
    queued before it (a QA run: pushed from outside into a FIFO crawl killed mid-crawl, the
    request was the first downloaded on resuming, with 20 of its host queued before it). It
    takes the order of the crawl's back queues."""
    project = _project(tmp_path)
    first = [f"http://a.example/item/{i}" for i in range(1, 4)]
    assert _push(project, redis_url, "fifo", *first).returncode == 0  # as its workers queue
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    late = "http://a.example/item/9"
    pushed = scrapy_ha("push", "fifo", late, "--redis-url", redis_url, cwd=outside)
    assert pushed.returncode == 0, pushed.stderr
    keys = Keys("ha", "fifo")
    queued = [decode_request(p, None).url for _, p in backqueues.pending(redis_client, keys)]
    assert queued == [*first, late]
    ids = [int(i) for i, _ in backqueues.pending(redis_client, keys)]
    assert redis_client.zscore(keys.ready, "0:a.example") == ids[0]
