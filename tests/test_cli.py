"""The ``scrapy-ha`` console script as users run it (not ``python -m``), on real crawls:
what it prints, its exit codes, the project's settings, and the destructive commands'
refusals; and the dead-letter queue's Python API."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.deadletters.dlq import DeadLetterQueue
from scrapy_ha.demo import harness
from scrapy_ha.keys import Keys
from tests import backqueues
from tests.spiders import FaultSpider
from tests.test_crash import wait_for_items, worker
from tests.test_retry_crawl import FAST_RETRIES

ROOT = Path(__file__).resolve().parent.parent
SCRAPY_HA = str(Path(sys.executable).parent / "scrapy-ha")


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


def scrapy_ha(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCRAPY_HA, *args], capture_output=True, text=True, timeout=60, cwd=cwd or ROOT
    )


class BodiesSpider(scrapy.Spider):
    """POSTs a JSON, a text and a binary body to pages that are gone (dead-lettered)."""

    name = "bodies"
    BODIES = {
        "json": b'{"sku": "A-1", "qty": 2}',
        "text": "caf\u00e9 au lait".encode(),
        "bytes": b"\x80\x04\xff raw",
    }

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base_url = base_url

    async def start(self) -> Any:
        for name, body in self.BODIES.items():
            yield scrapy.Request(
                f"{self.base_url}/status/404?{name}",
                method="POST",
                body=body,
                errback=self.on_error,
            )

    def on_error(self, failure: Any) -> None:
        pass


async def crawl(spider: type[scrapy.Spider], redis_url: str, site: Any, **kwargs: Any) -> Any:
    settings = {**FAST_RETRIES, "REDIS_URL": redis_url, **kwargs.pop("settings", {})}
    crawler = get_crawler(spider, settings)
    await crawler.crawl_async(base_url=site.url, **kwargs)
    return crawler


def test_status_of_a_spider_without_keys_says_no_such_crawl(redis_url):
    result = scrapy_ha("--redis-url", redis_url, "status", "nobody")
    assert result.returncode == 1
    assert "no such crawl" in result.stderr and "'nobody'" in result.stderr
    assert result.stdout == ""


def test_dlq_list_of_an_empty_queue_says_empty(redis_url, redis_client):
    redis_client.hset("ha:{nobody}:stats", "acked", 1)  # a crawl with no dead letter
    result = scrapy_ha("--redis-url", redis_url, "dlq", "list", "nobody")
    assert result.returncode == 0
    assert result.stdout.strip() == "dead-letter queue of nobody: empty"


@deferred_f_from_coro_f
async def test_dlq_list_has_a_header_and_totals_and_show_prints_bodies_as_text(redis_url, site):
    await crawl(
        FaultSpider,
        redis_url,
        site,
        paths=("/status/404", "/status/410", "/flaky/2?fail=9&status=503"),
    )
    lines = scrapy_ha("--redis-url", redis_url, "dlq", "list", "faults").stdout.splitlines()
    assert lines[0].split() == ["ID", "WHEN", "CLASS", "STATUS", "TRIES", "REASON", "URL"]
    assert len(lines) == 5
    # the columns line up with the ids a worker makes (20 characters and more; before, the
    # ID column was 10 wide and every row ran past the header)
    when = lines[0].index("WHEN")
    rows = lines[1:4]
    assert all(row[when - 2 : when] == "  " and row[when : when + 2] == "20" for row in rows), lines
    assert lines[-1] == "3 entries listed (gone 2, server 1)"
    only = scrapy_ha("--redis-url", redis_url, "dlq", "list", "faults", "--limit", "1").stdout
    assert only.splitlines()[-1].startswith("1 entry listed")
    none = scrapy_ha("--redis-url", redis_url, "dlq", "list", "faults", "--class", "banned")
    assert none.stdout.strip() == "dead-letter queue of faults: empty (for these filters)"

    await crawl(BodiesSpider, redis_url, site)
    async with DeadLetterQueue.from_url(redis_url, "bodies") as dlq:
        ids = {e.url.rsplit("?", 1)[1]: e.id for e in await dlq.entries()}
    assert set(ids) == {"json", "text", "bytes"}

    def show(kind: str) -> tuple[str, dict[str, Any]]:
        out = scrapy_ha("--redis-url", redis_url, "dlq", "show", "bodies", ids[kind]).stdout
        return out, json.loads(out)

    out, shown = show("json")
    assert shown["body_format"] == "json" and shown["body"] == {"sku": "A-1", "qty": 2}
    assert '    "sku": "A-1",' in out  # pretty-printed, not a base64 blob
    out, shown = show("text")
    assert shown["body_format"] == "text" and "café au lait" in out
    out, shown = show("bytes")
    assert shown["body_format"] == "bytes" and shown["body"] == "\\x80\\x04\\xff raw"


@deferred_f_from_coro_f
async def test_the_python_api_needs_nothing_private(redis_url, redis_client, site):
    """`DeadLetterQueue.from_url`: filter by class, domain and limit, requeue and purge by id."""
    paths = ("/status/404?a", "/status/404?b", "/status/410", "/flaky/3?fail=9&status=503")
    await crawl(FaultSpider, redis_url, site, paths=paths)
    async with DeadLetterQueue.from_url(redis_url, "faults") as dlq:
        everything = await dlq.entries()
        assert len(everything) == 4
        assert len(await dlq.entries(domain="127.0.0.1")) == 4
        assert await dlq.entries(domain="example.com") == []
        gone = await dlq.entries(failure_class="gone")
        assert {e.url.replace(site.url, "") for e in gone} == set(paths[:3])
        assert len(await dlq.entries(failure_class="gone", limit=2)) == 2
        with pytest.deprecated_call():  # the name before failure_class
            assert await dlq.entries(cls="gone") == gone
        with pytest.deprecated_call():
            assert gone[0].cls == "gone"
        (server,) = await dlq.entries(failure_class="server")
        assert await dlq.requeue([server.id]) == 1
        assert await dlq.requeue([server.id]) == 0  # idempotent
        assert await dlq.get(server.id) is None
        assert await dlq.purge([gone[0].id]) == 1
        assert {e.id for e in await dlq.entries()} == {e.id for e in gone[1:]}
    assert backqueues.count(redis_client, Keys("ha", "faults")) == 1  # the requeued one waits


@deferred_f_from_coro_f
async def test_requeue_and_purge_by_id_class_domain_and_limit(redis_url, redis_client, site):
    paths = tuple(f"/status/404?n={i}" for i in range(4)) + ("/flaky/4?fail=9&status=503",)
    await crawl(FaultSpider, redis_url, site, paths=paths)
    cli = ("--redis-url", redis_url, "dlq")
    assert scrapy_ha(
        *cli, "requeue", "faults", "--yes", "--class", "gone", "--limit", "1"
    ).stdout.strip() == ("requeued 1 of 1 entry")
    assert scrapy_ha(
        *cli, "requeue", "faults", "--yes", "--domain", "example.com"
    ).stdout.strip() == ("requeued 0 of 0 entries")
    assert scrapy_ha(*cli, "requeue", "faults", "--yes", "--class", "server").stdout.strip() == (
        "requeued 1 of 1 entry"
    )
    exported = [json.loads(x) for x in scrapy_ha(*cli, "export", "faults").stdout.splitlines()]
    assert len(exported) == 3 and {e["class"] for e in exported} == {"gone"}
    assert len(scrapy_ha(*cli, "export", "faults", "--limit", "2").stdout.splitlines()) == 2
    first, second = exported[0]["id"], exported[1]["id"]
    typo = scrapy_ha(*cli, "requeue", "faults", "999999", "--yes")  # said, exit 1
    assert typo.returncode == 1 and "no dead letter 999999 in faults" in typo.stderr
    dry = scrapy_ha(*cli, "purge", "faults", first, first, "999999", "--dry-run")
    assert dry.returncode == 1 and dry.stdout.startswith("would purge 1 entry of faults")
    assert scrapy_ha(*cli, "purge", "faults", first, second, "--yes").stdout.strip() == (
        "purged 2 of 2 entries"
    )
    assert scrapy_ha(*cli, "purge", "faults", "--yes", "--domain", "127.0.0.1").stdout.strip() == (
        "purged 1 of 1 entry"
    )
    assert redis_client.zcard("ha:{faults}:dead") == 0
    assert backqueues.count(redis_client, Keys("ha", "faults")) == 2


@deferred_f_from_coro_f
async def test_the_console_script_reads_the_projects_redis_url_and_prefix(
    redis_url, site, tmp_path
):
    await crawl(
        FaultSpider, redis_url, site, paths=("/status/404",), settings={"HA_KEY_PREFIX": "shop"}
    )
    project = tmp_path / "project"
    shutil.copytree(
        ROOT / "example_project",
        project,
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
    )
    settings = project / "catalogue" / "settings.py"
    settings.write_text(
        settings.read_text().replace(
            'REDIS_URL = "redis://127.0.0.1:6379/0"',
            f'REDIS_URL = "{redis_url}"\nHA_KEY_PREFIX = "shop"',
        )
    )
    status = scrapy_ha("status", "faults", "--json", cwd=project)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["dead"] == 1
    # outside the project: the default Redis and prefix, where this crawl is not
    elsewhere = scrapy_ha("--redis-url", redis_url, "status", "faults", cwd=tmp_path)
    assert elsewhere.returncode == 1 and "no such crawl" in elsewhere.stderr


def test_flush_refuses_while_a_worker_lives(redis_url, redis_client, site_factory, tmp_path):
    # slow enough that the worker is still crawling when the command runs (about 25 s)
    site = site_factory("--pages", "100", "--per-page", "20", "--delay", "0.2")
    items = tmp_path / "items.jl"
    live = worker(redis_url, site.url, items, tmp_path / "worker.log")
    wait_for_items(items, 20, live)
    refused = scrapy_ha("--redis-url", redis_url, "flush", "catalogue", "--yes")
    assert refused.returncode == 1 and "alive" in refused.stderr
    assert redis_client.zcard("ha:{catalogue}:workers") == 1
    assert redis_client.exists("ha:{catalogue}:payload")  # nothing deleted
    live.send_signal(signal.SIGINT)
    assert live.wait(60) == 0
    harness.wait_for(
        lambda: redis_client.zcard("ha:{catalogue}:workers") == 0, "the worker to leave", timeout=30
    )
    done = scrapy_ha("--redis-url", redis_url, "flush", "catalogue", "--yes")
    assert done.returncode == 0
    assert done.stdout.startswith("flushed catalogue; its checkpoints are kept")  # its spider's
    assert not redis_client.exists("ha:{catalogue}:payload", "ha:{catalogue}:ready")


@deferred_f_from_coro_f
async def test_flush_on_start_clears_a_finished_crawls_dead_letters(redis_url, redis_client, site):
    await crawl(FaultSpider, redis_url, site, paths=("/status/404", "/status/410"))
    assert redis_client.zcard("ha:{faults}:dead") == 2
    crawler = await crawl(
        FaultSpider,
        redis_url,
        site,
        paths=("/item/1",),
        settings={"SCHEDULER_FLUSH_ON_START": True},
    )
    assert redis_client.zcard("ha:{faults}:dead") == 0
    assert crawler.stats.get_value("item_scraped_count") == 1
