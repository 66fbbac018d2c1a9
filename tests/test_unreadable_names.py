"""State under the prefix that scrapy-ha never writes costs its crawl alone, never every
crawl: a key name that is not UTF-8, a Bloom filter's meta hash without a field or with a
part of 0 bytes. A real redis-server, the real exporter's collector, dashboard and command."""

from __future__ import annotations

import asyncio
import logging
import subprocess

import redis
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.ops.metrics import CrawlCollector
from tests.test_cli import SCRAPY_HA
from tests.test_dashboard_api import dashboard
from tests.test_metrics import live_crawl

#: A key under the prefix whose name is not UTF-8 (another program's, or a typo in bytes).
NOT_UTF8 = b"ha:{caf\xe9}:stats"
#: Why the exporter cannot read crawl ``odd``, whose Bloom filter's meta hash has no ``k``.
FIX = (
    " (the hash ha:{S}:bloom holds whole numbers capacity, k and part from 1): restore or delete it"
)
ODD_REASON = "cannot read the crawl odd: unreadable Bloom filter meta: no field 'k'"


def _samples(collector: CrawlCollector) -> dict[tuple[str, tuple[str, ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.values()))): s.value
        for family in collector.collect()
        for s in family.samples
    }


@deferred_f_from_coro_f
async def test_a_key_name_that_is_not_utf8_is_skipped_by_the_exporter_and_logged_once(
    redis_url, caplog
):
    await live_crawl(redis_url)
    client = redis.Redis.from_url(redis_url)
    client.hset(NOT_UTF8, "acked", 1)
    collector = CrawlCollector(client, "ha", discovery_ttl=0)
    with caplog.at_level(logging.WARNING, logger="scrapy_ha"):
        first, second = _samples(collector), _samples(collector)
    for samples in (first, second):
        assert samples[("scrapy_ha_redis_up", ())] == 1
        assert samples[("scrapy_ha_crawls", ())] == 1
        assert samples[("scrapy_ha_requests", ("live", "pending"))] == 2
    said = [r.getMessage() for r in caplog.records if "UTF-8" in r.getMessage()]
    assert len(said) == 1 and "1 key name" in said[0] and "caf\\xe9" in said[0], said
    client.close()


@deferred_f_from_coro_f
async def test_a_key_name_that_is_not_utf8_is_skipped_by_the_dashboard(redis_url):
    await live_crawl(redis_url)
    client = redis.Redis.from_url(redis_url)
    client.hset(NOT_UTF8, "acked", 1)
    client.close()

    def check() -> None:
        with dashboard(redis_url) as http:
            api = http.get("/api/crawls")
            assert api.status_code == 200, api.text
            assert [c["spider"] for c in api.json()["crawls"]] == ["live"]
            assert http.get("/").status_code == 200

    await asyncio.to_thread(check)


@deferred_f_from_coro_f
async def test_an_error_no_reader_foresaw_costs_the_exporter_that_crawl_alone(redis_url, caplog):
    await live_crawl(redis_url)
    client = redis.Redis.from_url(redis_url)
    client.hset("ha:{odd}:stats", "acked", 1)
    client.hset("ha:{odd}:bloom", mapping={"capacity": 1000, "part": 4096})  # no k
    collector = CrawlCollector(client, "ha", discovery_ttl=0)
    with caplog.at_level(logging.WARNING, logger="scrapy_ha.ops.metrics"):
        samples = _samples(collector)
    assert samples[("scrapy_ha_redis_up", ())] == 1
    assert samples[("scrapy_ha_requests", ("live", "pending"))] == 2
    assert samples[("scrapy_ha_crawl_read_error", ("live",))] == 0
    assert samples[("scrapy_ha_crawl_read_error", ("odd",))] == 1
    assert [r.getMessage() for r in caplog.records if "odd" in r.getMessage()] == [
        "cannot read the crawl odd, its series are left out (scrapy_ha_crawl_read_error 1): "
        f"{ODD_REASON}{FIX}"
    ]
    client.close()


#: Why crawl ``zero`` cannot be read: its Bloom filter's parts are 0 bytes (a layer of
#: them never ended: every reader looped for ever).
ZERO_REASON = (
    "cannot read the crawl zero: unreadable Bloom filter meta: part is '0', not a whole "
    "number of 1 or more"
)


def _bad_blooms(client: redis.Redis) -> None:
    """``odd``, whose Bloom meta has no ``k``; ``zero``, whose parts are 0 bytes."""
    for spider, meta in (("odd", {"part": 4096}), ("zero", {"k": 7, "part": 0})):
        client.hset(f"ha:{{{spider}}}:stats", "acked", 1)
        client.hset(f"ha:{{{spider}}}:bloom", mapping={"capacity": 1000, "layers": 1, **meta})


@deferred_f_from_coro_f
async def test_a_bloom_meta_without_k_or_with_parts_of_0_bytes_is_named_not_looped_on(redis_url):
    await live_crawl(redis_url)
    client = redis.Redis.from_url(redis_url)
    _bad_blooms(client)
    samples = _samples(CrawlCollector(client, "ha", discovery_ttl=0))
    assert samples[("scrapy_ha_requests", ("live", "pending"))] == 2
    assert samples[("scrapy_ha_crawl_read_error", ("odd",))] == 1
    assert samples[("scrapy_ha_crawl_read_error", ("zero",))] == 1
    client.close()
    await asyncio.to_thread(_dashboard_and_status_name_them, redis_url)


def _dashboard_and_status_name_them(redis_url: str) -> None:
    with dashboard(redis_url) as http:  # it shows no Bloom filter: they read as crawls
        assert http.get("/api/crawls").status_code == 200
        assert http.get("/crawls/zero").status_code == 200
    for spider, reason in (("odd", ODD_REASON), ("zero", ZERO_REASON)):
        done = subprocess.run(
            [SCRAPY_HA, "status", spider, "--redis-url", redis_url],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, done.stderr
        assert done.stderr == f"error: {reason}{FIX}\n"
