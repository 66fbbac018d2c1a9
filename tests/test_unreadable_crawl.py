"""One key of another type under the prefix (``SET ha:{other}:stats x``: by hand, or another
program) costs its crawl alone: the exporter still reads Redis and every other crawl, and
marks that one with ``scrapy_ha_crawl_read_error 1``; the dashboard's overview lists it
apart with the key; ``scrapy-ha status`` of it says which key holds what and exits 2.
A real redis-server, the real exporter, dashboard and command."""

from __future__ import annotations

import asyncio
import logging
import subprocess

import pytest
import redis
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.ops.metrics import CrawlCollector
from scrapy_ha.store.sharding import check_shard_count, make_queue
from tests.test_cli import SCRAPY_HA
from tests.test_dashboard_api import dashboard
from tests.test_dashboard_pages import entry
from tests.test_metrics import crawl_samples, live_crawl, value
from tests.test_metrics import exporter_factory as exporter_factory  # a fixture

STATS_HELD = "ha:{other}:stats holds a string (scrapy-ha keeps a hash there)"
SHARD_HELD = "ha:{wide:1}:dead holds a string (scrapy-ha keeps a zset there)"


async def broken_crawls(url: str) -> None:
    """``live`` as a crawl leaves it, ``other`` whose stats hash is a string, and ``wide``
    (2 shards) whose shard 1's dead-letter set is a string."""
    await live_crawl(url)
    client = redis.asyncio.Redis.from_url(url)
    wide = make_queue(client, "ha", "wide", 2)
    await check_shard_count(wide)
    await wide.sync(enqueue=[entry(f"http://wide.example/{i}") for i in range(40)])
    await client.set("ha:{other}:stats", "x")
    await client.set("ha:{wide:1}:dead", "x")
    await client.aclose()


@deferred_f_from_coro_f
async def test_the_exporter_reads_every_other_crawl_and_marks_the_unreadable_one(
    redis_url, exporter_factory
):
    await broken_crawls(redis_url)
    samples = exporter_factory(redis_url).scrape()
    assert value(samples, "scrapy_ha_redis_up") == 1
    assert value(samples, "scrapy_ha_crawls") == 3
    assert value(samples, "scrapy_ha_requests", spider="live", state="pending") == 2
    assert value(samples, "scrapy_ha_crawl_read_error", spider="live") == 0
    for spider in ("other", "wide"):
        assert value(samples, "scrapy_ha_crawl_read_error", spider=spider) == 1
        assert list(crawl_samples(samples, spider)) == [
            ("scrapy_ha_crawl_read_error", frozenset({("spider", spider)}))
        ]


@deferred_f_from_coro_f
async def test_the_exporters_log_names_the_key_once_and_when_it_reads_again(
    redis_url, redis_client, caplog
):
    await broken_crawls(redis_url)
    collector = CrawlCollector(redis.Redis.from_url(redis_url), "ha", discovery_ttl=0)
    with caplog.at_level(logging.INFO, logger="scrapy_ha.ops.metrics"):
        list(collector.collect())
        list(collector.collect())
        redis_client.delete("ha:{other}:stats")
        redis_client.hset("ha:{other}:stats", "acked", 1)
        list(collector.collect())
    said = [r.getMessage() for r in caplog.records]
    assert [m for m in said if STATS_HELD in m] == [
        f"cannot read the crawl other, its series are left out "
        f"(scrapy_ha_crawl_read_error 1): {STATS_HELD}: rename or delete it"
    ]
    assert sum(SHARD_HELD in m for m in said) == 1
    assert "the crawl other reads again" in said
    assert not any("unreachable" in m for m in said)


@deferred_f_from_coro_f
async def test_the_dashboard_lists_the_unreadable_crawl_apart(redis_url):
    await broken_crawls(redis_url)

    def check() -> None:
        with dashboard(redis_url) as http:
            api = http.get("/api/crawls")
            assert api.status_code == 200
            assert [c["spider"] for c in api.json()["crawls"]] == ["live"]
            unreadable = api.json()["unreadable"]
            assert set(unreadable) == {"other", "wide"}
            assert unreadable["other"].startswith(STATS_HELD)
            assert unreadable["wide"].startswith(SHARD_HELD)
            page = http.get("/")
            assert page.status_code == 200 and "ha:{other}:stats holds a string" in page.text
            one = http.get("/api/crawls/other")
            assert one.status_code == 409 and STATS_HELD in one.json()["error"]
            for spider, held in (("other", STATS_HELD), ("wide", SHARD_HELD)):
                page = http.get(f"/crawls/{spider}")
                assert page.status_code == 409 and held in page.text
            assert http.get("/api/crawls/live").status_code == 200

    await asyncio.to_thread(check)


@deferred_f_from_coro_f
async def test_status_names_the_key_and_exits_2(redis_url):
    await broken_crawls(redis_url)
    await asyncio.to_thread(_status_of_each, redis_url)


def _status_of_each(redis_url: str) -> None:
    for spider, held in (("other", STATS_HELD), ("wide", SHARD_HELD)):
        done = subprocess.run(
            [SCRAPY_HA, "status", spider, "--redis-url", redis_url],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"error: {held}"), done.stderr
        assert "Traceback" not in done.stderr
    live = subprocess.run(
        [SCRAPY_HA, "status", "live", "--redis-url", redis_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert live.returncode == 0, live.stderr


@pytest.mark.parametrize(
    ("name", "kept"), [("dict", "hash"), ("joins", "zset"), ("finish", "string")]
)
def test_a_key_of_the_whole_crawl_of_a_wrong_type_is_named(redis_client, name, kept):
    """``SET ha:{live}:dict x``: the dashboard's 409 said Redis's WRONGTYPE alone, no key."""
    from scrapy_ha.ops.unreadable import explain_sync

    key = f"ha:{{live}}:{name}"
    if kept == "string":
        redis_client.hset(key, "a", 1)
        found = "hash"
    else:
        redis_client.set(key, "x")
        found = "string"
    error = redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind")
    explained = str(explain_sync(redis_client, "ha", "live", error))
    assert f"{key} holds a {found} (scrapy-ha keeps a {kept} there)" in explained, explained


READY_HELD = "ha:{junk}:ready holds a string (scrapy-ha keeps a zset there)"


@deferred_f_from_coro_f
async def test_a_frontier_key_of_another_type_is_named_not_read_as_nothing_pending(
    redis_url, redis_client, exporter_factory
):
    """A QA run: ``SET ha:{junk}:ready y`` on a crawl holding requests read "pending 0" in
    ``status``, the metrics and the dashboard, with no error anywhere (the count's script
    took the error for a worker's, whose next sync sets the key aside)."""
    client = redis.asyncio.Redis.from_url(redis_url)
    await make_queue(client, "ha", "junk", 1).sync(
        enqueue=[entry(f"http://junk.example/{i}") for i in range(5)]
    )
    await client.aclose()
    redis_client.delete("ha:{junk}:ready")
    redis_client.set("ha:{junk}:ready", "y")
    done = await asyncio.to_thread(
        subprocess.run,
        [SCRAPY_HA, "status", "junk", "--redis-url", redis_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(f"error: {READY_HELD}"), done.stderr
    samples = exporter_factory(redis_url).scrape()
    assert value(samples, "scrapy_ha_crawl_read_error", spider="junk") == 1
    with dashboard(redis_url) as http:
        one = http.get("/api/crawls/junk")
        assert one.status_code == 409 and READY_HELD in one.json()["error"], one.text
