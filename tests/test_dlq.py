"""The dead-letter queue: the `scrapy-ha` commands and the Python API, on real dead letters."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.keys import Keys
from tests import backqueues
from tests.spiders import FaultSpider
from tests.test_retry_crawl import FAST_RETRIES

PATHS = ("/status/404", "/status/410", "/flaky/2?fail=9&status=503", "/item/5")


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


#: The console script installed with the package (what users run).
SCRAPY_HA = str(Path(sys.executable).parent / "scrapy-ha")


def cli(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCRAPY_HA, "--redis-url", redis_url, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def crawl(redis_url: str, site, paths=PATHS):
    crawler = get_crawler(FaultSpider, {**FAST_RETRIES, "REDIS_URL": redis_url})
    await crawler.crawl_async(base_url=site.url, paths=paths)
    return crawler


@deferred_f_from_coro_f
async def test_status_export_list_requeue_purge(redis_url, redis_client, site):
    await crawl(redis_url, site)
    status = json.loads(cli(redis_url, "status", "faults", "--json").stdout)
    assert isinstance(status.pop("redis"), list)  # the Redis check: tests/test_redis_health.py
    states = ("spider", "pending", "leased", "delayed", "dead", "workers", "fingerprints")
    assert {k: status[k] for k in states} == {
        "spider": "faults",
        "pending": 0,
        "leased": 0,
        "delayed": 0,
        "dead": 3,
        "workers": 0,
        "fingerprints": 4,
    }

    exported = [
        json.loads(line) for line in cli(redis_url, "dlq", "export", "faults").stdout.splitlines()
    ]
    by_url = {e["url"].replace(site.url, ""): e for e in exported}
    assert set(by_url) == {"/status/404", "/status/410", "/flaky/2?fail=9&status=503"}
    assert by_url["/status/404"]["class"] == "gone" and by_url["/status/404"]["attempts"] == 1
    assert by_url["/flaky/2?fail=9&status=503"]["attempts"] == 3
    assert by_url["/flaky/2?fail=9&status=503"]["reason"] == "HTTP 503"
    # the request stored is the one that failed last, its attempts counted (not the one
    # stored by the last retry, one attempt behind: a requeue or an export would use it)
    failed = json.loads(
        cli(redis_url, "dlq", "show", "faults", by_url["/flaky/2?fail=9&status=503"]["id"]).stdout
    )
    assert failed["request"]["mt"]["ha_retries"] == {"server": 3}, failed["request"]
    assert len(failed["request"]["mt"]["ha_history"]) == 3

    listed = cli(redis_url, "dlq", "list", "faults", "--class", "gone").stdout.splitlines()
    assert len(listed) == 4 and all(" gone " in line for line in listed[1:3])
    assert listed[3] == "2 entries listed (gone 2)"
    entry_id = by_url["/status/404"]["id"]
    shown = json.loads(cli(redis_url, "dlq", "show", "faults", entry_id).stdout)
    assert "body" not in shown  # a GET has none
    assert shown["request"]["u"] == site.url + "/status/404"

    out = cli(redis_url, "dlq", "requeue", "faults", "--reason", "http 503", "--yes").stdout
    assert out.strip() == "requeued 1 of 1 entry"
    assert cli(
        redis_url, "dlq", "requeue", "faults", "--reason", "http 503", "--yes"
    ).stdout.strip() == ("requeued 0 of 0 entries")  # idempotent
    keys = Keys("ha", "faults")
    ((pending_id, payload),) = backqueues.pending(redis_client, keys)
    # the entry left the dead-letter queue whole: its reason went with it
    assert not redis_client.hexists(keys.dead_info, pending_id)
    assert redis_client.hlen(keys.dead_info) == redis_client.zcard(keys.dead) == 2
    payload = json.loads(payload)
    assert "ha_retries" not in json.dumps(payload)  # attempts reset

    # the requeued request is crawled again with a fresh budget (and fails again here)
    await crawl(redis_url, site, paths=())
    again = json.loads(cli(redis_url, "dlq", "show", "faults", pending_id.decode()).stdout)
    assert again["attempts"] == 3 and again["class"] == "server"

    assert cli(redis_url, "dlq", "purge", "faults").returncode == 1  # needs ids, filter or --all
    assert (
        cli(redis_url, "dlq", "purge", "faults", "--all", "--yes").stdout.strip()
        == "purged 3 of 3 entries"
    )
    assert redis_client.zcard(keys.dead) == 0 and redis_client.hlen(keys.dead_info) == 0


def test_the_cli_names_an_unreachable_redis(redis_server):
    from tests.conftest import free_port

    result = cli(f"redis://:pw@127.0.0.1:{free_port()}/0", "status", "faults")
    assert result.returncode == 2
    assert "redis://:***@127.0.0.1" in result.stderr and "pw@" not in result.stderr


@deferred_f_from_coro_f
async def test_dead_letter_retention_drops_the_oldest(redis_url, redis_client, site, caplog):
    caplog.set_level(logging.INFO, logger="scrapy_ha")
    paths = tuple(f"/status/404?n={i}" for i in range(4))  # one past the limit: trimmed
    crawler = get_crawler(
        FaultSpider,
        {
            **FAST_RETRIES,
            "REDIS_URL": redis_url,
            "HA_DLQ_MAX_ENTRIES": 3,
            "HA_DLQ_WARN_THRESHOLD": 2,
        },
    )
    await crawler.crawl_async(base_url=site.url, paths=paths)
    keys = Keys("ha", "faults")
    assert redis_client.zcard(keys.dead) == 3
    assert redis_client.hlen(keys.dead_info) == 3
    assert redis_client.hlen(keys.payload) == 3  # the dropped entries' payloads went too
    assert crawler.stats.get_value("ha/dead/gone") == 4
    assert "HA_DLQ_WARN_THRESHOLD=2" in caplog.text  # warned once the queue passed 2
    # one line each, at INFO: the spider's errback handled every 404
    assert caplog.text.count("Dead-lettered") == 4
    assert caplog.text.count("the spider's errback handled it") == 4


@deferred_f_from_coro_f
async def test_dead_letter_retention_drops_entries_past_their_age(redis_url, redis_client, site):
    settings = {**FAST_RETRIES, "REDIS_URL": redis_url, "HA_DLQ_MAX_AGE": 1}
    await get_crawler(FaultSpider, settings).crawl_async(
        base_url=site.url, paths=("/status/404?old",)
    )
    (old,) = redis_client.zrange(Keys("ha", "faults").dead, 0, -1)
    await asyncio.sleep(1.5)  # the entry's age passes HA_DLQ_MAX_AGE
    await get_crawler(FaultSpider, settings).crawl_async(
        base_url=site.url, paths=("/status/404?new",)
    )
    exported = [
        json.loads(x) for x in cli(redis_url, "dlq", "export", "faults").stdout.splitlines()
    ]
    assert [e["url"] for e in exported] == [site.url + "/status/404?new"]
    assert redis_client.hget(Keys("ha", "faults").dead_info, old) is None
