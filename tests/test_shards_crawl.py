"""Real crawls of a sharded crawl (HA_SHARDS): on one Redis, on a 3-master Redis Cluster,
and with a worker SIGKILLed mid-crawl; `scrapy-ha status --json` sums the shards."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from typing import TYPE_CHECKING, Any

import pytest
import redis
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.keys import Keys, task_shard
from tests import backqueues, redis_servers
from tests.spiders import CatalogueSpider, FedSpider
from tests.test_checkpoints import run_paged
from tests.test_cli import scrapy_ha
from tests.test_crash import Progress, check_nothing_lost, reclaimed, wait_for_items, worker
from tests.test_keeper import stat
from tests.test_keeper import worker as blocking_worker
from tests.test_redis_failover import assert_nothing_lost, crawl_settings

if TYPE_CHECKING:
    from pathlib import Path

    from tests.conftest import Site


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


def tags(keys: list[bytes], spider: str) -> set[str]:
    """The hash tags of the crawl's keys."""
    found = (re.match(rb"ha:\{(" + spider.encode() + rb"[^}]*)\}:", k) for k in keys)
    return {m.group(1).decode() for m in found if m}


def status(url: str, spider: str) -> dict[str, Any]:
    result = scrapy_ha("--redis-url", url, "status", spider, "--json")
    assert result.returncode == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


@deferred_f_from_coro_f
async def test_a_crawl_with_four_shards_on_one_redis(redis_url, site: Site):
    crawler = get_crawler(
        CatalogueSpider, crawl_settings(redis_url, SCHEDULER_PERSIST=True, HA_SHARDS=4)
    )
    await crawler.crawl_async(base_url=site.url)
    assert_nothing_lost(crawler.spider, 50)
    assert len(crawler.spider.items) == 50  # every page once: no duplicate on a clean run
    assert all(n == 1 for n in site.hits().values())
    client = redis.Redis.from_url(redis_url)
    assert tags(client.keys("ha:*"), "catalogue") == {
        "catalogue",  # the shard count
        *(f"catalogue:{i}" for i in range(4)),
    }
    assert client.get("ha:{catalogue}:shards") == b"4"
    for i in range(4):  # each shard did some of the work
        assert int(client.hget(f"ha:{{catalogue:{i}}}:stats", "acked") or 0) > 0
    client.close()
    doc = await asyncio.to_thread(status, redis_url, "catalogue")
    pages = sum(site.hits().values())
    assert doc["totals"]["acked"] == pages == 55  # 5 list pages, 50 items
    assert doc["totals"]["enqueued"] == 55
    assert doc["fingerprints"] == 55
    assert (doc["pending"], doc["leased"], doc["delayed"]) == (0, 0, 0)


@deferred_f_from_coro_f
async def test_a_worker_with_another_shard_count_is_refused_at_start(redis_url, site: Site, caplog):
    first = get_crawler(
        CatalogueSpider, crawl_settings(redis_url, SCHEDULER_PERSIST=True, HA_SHARDS=4)
    )
    await first.crawl_async(base_url=site.url)
    second = get_crawler(
        CatalogueSpider, crawl_settings(redis_url, SCHEDULER_PERSIST=True, HA_SHARDS=2)
    )
    hits = sum(site.hits().values())
    await second.crawl_async(base_url=site.url)
    assert "HA_SHARDS=2 but the crawl of catalogue is in Redis with HA_SHARDS=4" in caplog.text
    assert sum(site.hits().values()) == hits  # it crawled nothing
    refused = scrapy_ha("--redis-url", redis_url, "status", "catalogue", "--shards", "2")
    assert refused.returncode == 2 and "HA_SHARDS=4" in refused.stderr


def test_the_cli_aggregates_or_refuses_a_sharded_crawl(redis_url):
    pushed = scrapy_ha(
        "--redis-url",
        redis_url,
        "--shards",
        "3",
        "push",
        "books",
        "--create",
        *(f"https://example.com/{i}" for i in range(30)),
    )
    assert pushed.returncode == 0, pushed.stderr
    client = redis.Redis.from_url(redis_url)
    assert client.get("ha:{books}:shards") == b"3"  # the first writer stored the count
    doc = status(redis_url, "books")
    assert doc["pending"] == 30 and doc["totals"]["enqueued"] == 30
    assert all(
        backqueues.count(client, Keys("ha", "books", shards=3).of_shard(i)) for i in range(3)
    )
    listed = scrapy_ha("--redis-url", redis_url, "dlq", "list", "books")
    assert listed.returncode == 0 and "empty" in listed.stdout, listed.stderr
    delayed = scrapy_ha("--redis-url", redis_url, "delayed", "list", "books")
    assert delayed.returncode == 0 and "no delayed request" in delayed.stdout, delayed.stderr
    paused = scrapy_ha("--redis-url", redis_url, "pause", "books")
    assert paused.returncode == 0, paused.stderr
    assert all(client.exists(f"ha:{{books:{i}}}:paused") for i in range(3))
    assert scrapy_ha("--redis-url", redis_url, "resume", "books").returncode == 0
    assert not any(client.exists(f"ha:{{books:{i}}}:paused") for i in range(3))
    flushed = scrapy_ha("--redis-url", redis_url, "flush", "books", "--yes")
    assert flushed.returncode == 0, flushed.stderr
    assert client.keys("ha:*") == []
    client.close()


@pytest.mark.parametrize(
    "pages, kill_at",
    [
        (20, 150),  # short enough for every CI run
        pytest.param(100, 1000, marks=pytest.mark.long),  # `make test-long`
    ],
    ids=["400-items", "2000-items"],
)
def test_a_sigkilled_worker_s_leases_come_back_from_every_shard(
    pages: int, kill_at: int, redis_url: str, site_factory: type[Site], tmp_path: Path
) -> None:
    per_page = 20
    site = site_factory("--pages", str(pages), "--per-page", str(per_page), "--delay", "0.002")
    items = tmp_path / "items.jl"
    victim = worker(
        redis_url, site.url, items, tmp_path / "victim.log", HA_SHARDS="3", HA_WORKER_ID="victim"
    )
    wait_for_items(items, 1, victim)
    survivor = worker(redis_url, site.url, items, tmp_path / "survivor.log", HA_SHARDS="3")
    wait_for_items(items, kill_at, victim)
    client = redis.Redis.from_url(redis_url)
    # Past kill_at items the victim may hold nothing: the pages form one chain, and the worker
    # that crawls a list page hands its links to its own engine (early downloads make that
    # worker faster still), so the other one can wait with no lease for a while. Killing it
    # then proves nothing: it is killed while it holds leases of its latest round.
    progress = Progress(items)
    held: list[tuple[int, str]] = []
    while not held:
        while not held_by(client, "victim", 3):
            progress.check()
            assert victim.poll() is None and progress.count < pages * per_page, (
                "the victim held no lease from its latest round after the kill point"
            )
            time.sleep(0.001)
        # stopped, then read: it acked them between the look above and a kill in a run of
        # the suite (held [], 21 reclaimed); the calls it had sent are done 50 ms later
        victim.send_signal(signal.SIGSTOP)
        time.sleep(0.05)
        held = held_by(client, "victim", 3)  # its leases of that round, left to reclaim
        if not held:
            victim.send_signal(signal.SIGCONT)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    client.close()
    assert survivor.wait(timeout=180) == 0, (tmp_path / "survivor.log").read_text()[-3000:]
    log = (tmp_path / "survivor.log").read_text()
    assert "'finish_reason': 'finished'" in log
    assert held and reclaimed(log) >= len(held), (held, reclaimed(log))
    check_nothing_lost(items, pages * per_page, site.hits(), bound=64)


def held_by(client: redis.Redis, worker_id: str, shards: int) -> list[tuple[int, str]]:
    """The leases of *worker_id*'s latest round (its grant in each shard) it still holds."""
    held = []
    for i in range(shards):
        for entry_id, token in client.hgetall(f"ha:{{catalogue:{i}}}:grant:{worker_id}").items():
            record = client.hget(f"ha:{{catalogue:{i}}}:leases", entry_id) or b""
            if record.split(b" ", 1)[0] == token:
                held.append((i, entry_id.decode()))
    return held


@pytest.fixture
def cluster(tmp_path: Path):
    found = redis_servers.start_cluster(tmp_path / "cluster")
    yield found
    found.stop()


@deferred_f_from_coro_f
async def test_a_crawl_with_six_shards_spreads_over_three_cluster_masters(cluster, site):
    settings = crawl_settings(cluster.url, SCHEDULER_PERSIST=True, HA_SHARDS=6)
    crawler = get_crawler(CatalogueSpider, settings)
    await crawler.crawl_async(base_url=site.url)
    assert_nothing_lost(crawler.spider, 50)
    masters = cluster.masters()
    assert len(masters) == 3
    holders = set()
    for i in range(6):
        owner = cluster.owner_of(f"ha:{{catalogue:{i}}}:stats")
        assert owner is not None
        with owner.client() as c:
            assert c.exists(f"ha:{{catalogue:{i}}}:stats")
        holders.add(owner.port)
    assert holders == set(masters)  # six tags: every master holds some shard
    doc = await asyncio.to_thread(status, cluster.url, "catalogue")
    assert doc["fingerprints"] == 55 and doc["totals"]["acked"] >= 55


def test_a_checkpointed_task_resumes_where_it_stopped_with_three_shards(
    redis_url: str, redis_client: redis.Redis, site_factory: type[Site], tmp_path: Path
) -> None:
    pages, per_page, stop_at = 30, 5, 15
    site = site_factory(
        "--pages", str(pages), "--per-page", str(per_page), "--slow-list", f"{stop_at}:60"
    )
    items = tmp_path / "items.jl"
    first = run_paged(redis_url, site.url, items, tmp_path / "first.log", HA_SHARDS="3")
    want = {"page": stop_at, "items": (stop_at - 1) * per_page}
    deadline = time.monotonic() + 90
    while True:  # the point to kill the worker at
        keys = redis_client.keys("ha:*:cp:*")
        saved = json.loads(redis_client.get(keys[0]) or b"{}") if keys else {}
        if all(saved.get(name) == value for name, value in want.items()):
            break
        assert first.poll() is None, f"the worker ended before the checkpoint {want}: {saved}"
        assert time.monotonic() < deadline, f"no checkpoint {want} in 90 s: {saved}"
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    (key,) = redis_client.keys("ha:*:cp:*")
    home = task_shard(key.decode().split(":cp:", 1)[1], 3)
    assert key.startswith(f"ha:{{paged:{home}}}:cp:".encode())  # beside its pages' leases
    for i in range(3):  # the queue is lost; only the checkpoint is left to resume from
        redis_client.delete(*Keys("ha", "paged", i, 3).all())
    before = len(site.log())
    second = run_paged(redis_url, site.url, items, tmp_path / "second.log", HA_SHARDS="3")
    assert second.wait(timeout=120) == 0, (tmp_path / "second.log").read_text()[-3000:]
    resumed = [path for _, path, _ in site.log()[before:]]
    assert resumed[0] == f"/list/{stop_at}" and "/list/1" not in resumed
    ids = [json.loads(line)["id"] for line in items.read_text().splitlines()]
    assert sorted(ids) == list(range(1, pages * per_page + 1))  # none lost, none twice


@deferred_f_from_coro_f
async def test_start_urls_feed_a_sharded_crawl_on_a_cluster(cluster, site):
    from redis.cluster import RedisCluster

    urls = [f"{site.url}/item/{i}" for i in range(1, 21)]
    first = cluster.nodes[0]
    with RedisCluster(host="127.0.0.1", port=first.port) as client:
        client.rpush("{fed}:start_urls", *urls)
    settings = crawl_settings(
        cluster.url, HA_SHARDS=6, REDIS_START_URLS_KEY="{%(name)s}:start_urls", HA_FEED=False
    )
    crawler = get_crawler(FedSpider, settings)
    await crawler.crawl_async()
    assert sorted(crawler.spider.seen) == sorted(f"GET {u} None" for u in urls)
    with RedisCluster(host="127.0.0.1", port=first.port) as client:
        assert client.llen("{fed}:start_urls") == 0


def test_a_blocking_callback_keeps_its_leases_in_every_shard(
    redis_url: str, redis_client: redis.Redis, site_factory: type[Site], tmp_path: Path
) -> None:
    site = site_factory("--pages", "3", "--per-page", "10", "--delay", "0.05")
    release = tmp_path / "release"  # the callback blocks until the second worker has joined
    first = blocking_worker(
        redis_url, site.url, tmp_path, "first", BLOCK_UNTIL=str(release), HA_SHARDS="3"
    )
    second = None
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "blocking").exists():
            assert first.poll() is None and time.monotonic() < deadline, "never blocked"
            time.sleep(0.02)
        second = blocking_worker(redis_url, site.url, tmp_path, "second", HA_SHARDS="3")
        while redis_client.zcard("ha:{blocking:0}:workers") < 2:
            assert second.poll() is None and time.monotonic() < deadline + 60, "never joined"
            time.sleep(0.05)
        release.write_text("go")
        assert second.wait(timeout=120) == 0
        assert first.wait(timeout=120) == 0
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    logs = {n: (tmp_path / f"{n}.log").read_text() for n in ("first", "second")}
    ids = [json.loads(line)["id"] for line in (tmp_path / "items.jl").read_text().splitlines()]
    assert sorted(ids) == list(range(1, 31)), logs["second"][-3000:]  # each item once
    assert site.hits()["/item/3"] == 1  # crawled once: its lease was renewed while blocked
    assert all(stat(log, "ha/reclaimed") == 0 for log in logs.values()), logs
    assert "The event loop was blocked for" in logs["first"]


@deferred_f_from_coro_f
async def test_a_sink_declared_unsharded_refuses_a_sharded_worker_saying_how(
    redis_url, site: Site, tmp_path, caplog
):
    """A sink declared without --shards made the crawl unsharded: the refusal said the
    crawl "has not finished (it runs, stopped before its end, ...)" and named a layout key
    it does not have."""
    declared = scrapy_ha(
        "--redis-url", redis_url, "items", "catalogue", "--to", f"jsonl:{tmp_path}/i.jl",
        "--declare", "--create",
    )  # fmt: skip
    assert declared.returncode == 0, declared.stderr
    crawler = get_crawler(CatalogueSpider, crawl_settings(redis_url, HA_SHARDS=2))
    await crawler.crawl_async(base_url=site.url)
    assert "HA_SHARDS=2 but the crawl of catalogue is in Redis unsharded" in caplog.text
    assert "ha:{catalogue}:shards" not in caplog.text
    assert "--shards 2 --declare" in caplog.text
    assert sum(site.hits().values()) == 0
