"""``scrapy-ha metrics`` as Prometheus scrapes it: the real command in a subprocess on a port
of its own, scraped over HTTP and parsed with prometheus-client's own parser, against what a
real crawl and the queue's API left in a real Redis; and a Redis that is down or frozen."""

from __future__ import annotations

import re
import selectors
import signal
import socket
import subprocess
import time
from typing import TYPE_CHECKING
from urllib.request import urlopen

import pytest
import redis.asyncio
from prometheus_client.parser import text_string_to_metric_families
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.demo import harness
from scrapy_ha.keys import Keys
from scrapy_ha.ops.crawls import UNKNOWN_CLASS, CrawlNumbers
from scrapy_ha.ops.stats import CrawlStats
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry
from tests.backqueues import pending
from tests.conftest import RedisServer
from tests.spiders import FaultSpider
from tests.test_cli import SCRAPY_HA, crawl
from tests.test_crash import wait_for_items, worker

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

DEAD_LETTERED = "scrapy_ha_dead_lettered_total"
#: Seconds the exporter has to print where it listens (it imports Scrapy first: slow here).
START_TIMEOUT = 60.0
#: Seconds a scrape may take while Redis is down or frozen: the exporter's --timeout (1 s)
#: for the one call that hangs, plus a loaded machine's slack; without timeouts it would hang.
DOWN_DEADLINE = 20.0

#: A real crawl's outcomes: acked, gone twice, acked after a retry, dead after its retries.
FAULT_PATHS = (
    "/item/1",
    "/status/404",
    "/status/410",
    "/flaky/2?fail=1&status=503",
    "/flaky/3?fail=9&status=503",
)
#: What it and the live crawl (:func:`live_crawl`) counted: (metric, labels, value).
COUNTED = [
    ("scrapy_ha_enqueued_total", {"spider": "faults"}, 5),
    ("scrapy_ha_acked_total", {"spider": "faults"}, 2),
    ("scrapy_ha_dead_lettered_total", {"spider": "faults", "class": "gone"}, 2),
    ("scrapy_ha_dead_lettered_total", {"spider": "faults", "class": "server"}, 1),
    ("scrapy_ha_retried_total", {"spider": "faults", "class": "server"}, 3),
    ("scrapy_ha_retry_outcomes_total", {"spider": "faults", "outcome": "ok"}, 1),
    ("scrapy_ha_retry_outcomes_total", {"spider": "faults", "outcome": "dead"}, 1),
    ("scrapy_ha_enqueued_total", {"spider": "live"}, 5),
    ("scrapy_ha_filtered_total", {"spider": "live"}, 0),
    ("scrapy_ha_start_duplicates_total", {"spider": "live"}, 1),
    ("scrapy_ha_retried_total", {"spider": "live", "class": "server"}, 1),
    ("scrapy_ha_dead_lettered_total", {"spider": "live", "class": "gone"}, 1),
    ("scrapy_ha_acked_total", {"spider": "live"}, 0),
]

#: A sample: (metric name as exposed, labels) -> value.
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


class Exporter:
    """``scrapy-ha metrics --port 0 --redis-url URL ARGS`` in a subprocess (the options after
    the subcommand, as in the reference); ``url`` is the address it printed once listening."""

    def __init__(self, redis_url: str, *args: str) -> None:
        command = [SCRAPY_HA, "metrics", "--port", "0", "--redis-url", redis_url, *args]
        self.proc = harness.spawn(command, stdout=subprocess.PIPE)  # its log: pytest's capture
        line = _first_line(self.proc, START_TIMEOUT)
        found = re.search(r"http://\S+/metrics", line)
        if not found:
            harness.stop(self.proc)
            pytest.fail(f"the exporter did not say where it listens: {line!r}")
        self.url = found.group(0)

    def scrape(self, timeout: float = DOWN_DEADLINE) -> Samples:
        with urlopen(self.url, timeout=timeout) as response:
            text = response.read().decode()
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def stop(self) -> None:
        harness.stop(self.proc)


def _first_line(proc: subprocess.Popen[bytes], timeout: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        ready = selector.select(timeout)
    return proc.stdout.readline().decode(errors="replace") if ready else ""


@pytest.fixture
def exporter_factory() -> Iterator[type[Exporter]]:
    started: list[Exporter] = []

    class _Factory(Exporter):
        def __init__(self, redis_url: str, *args: str) -> None:
            super().__init__(redis_url, *args)
            started.append(self)

    yield _Factory
    for exporter in started:
        exporter.stop()


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def crawl_samples(samples: Samples, spider: str) -> Samples:
    return {k: v for k, v in samples.items() if ("spider", spider) in k[1]}


async def live_crawl(redis_url: str, prefix: str = "ha") -> None:
    """Spider ``live`` mid-crawl through the queue's API: 2 pending, 1 leased by a live
    worker, 1 delayed, 1 dead, one domain gated now and one whose gate has passed."""
    queue = RedisQueue(redis.asyncio.Redis.from_url(redis_url), Keys(prefix, "live"))
    try:
        entries = [NewEntry(b"fp%d" % i, 0, b"request %d" % i) for i in range(5)]
        assert await queue.enqueue([*entries, entries[0]]) == 5  # the last one is a duplicate
        leases = await queue.lease(3, 600_000)
        pairs = [(lease.id, lease.token) for lease in leases]
        await queue.renew(pairs, worker="w1", lease_ms=600_000, heartbeat_ms=600_000)
        delayed, dead, _ = leases
        assert await queue.retry_later(
            delayed.id, delayed.token, 600_000, delayed.payload, failure_class="server"
        )
        assert await queue.dead_letter(dead.id, dead.token, {"class": "gone", "reason": "404"})
        await queue.close_gate("held.example", 600_000)
        await queue.close_gate("passed.example", 1)
    finally:
        await queue.client.aclose()


def redis_numbers(client: redis.Redis, spider: str) -> dict[str, int]:
    """What Redis holds, read directly: the state sizes and the stats hash."""
    k = Keys("ha", spider)
    now_ms = int(client.time()[0]) * 1000
    found = {"pending": len(pending(client, k)), "leased": int(client.zcard(k.leased))}
    found.update(delayed=int(client.zcard(k.delayed)), dead=int(client.zcard(k.dead)))
    found["workers"] = int(client.zcount(k.workers, now_ms, "+inf"))
    # the exact set in buckets (a worker's crawl), or as one set (a queue made by hand)
    found["fingerprints"] = int(client.hget(k.buckets, "n") or 0) + int(client.scard(k.dupefilter))
    stats = client.hgetall(k.stats)
    found.update({f"stats:{f.decode()}": int(v) for f, v in stats.items()})
    return found


@deferred_f_from_coro_f
async def test_every_crawl_under_the_prefix_is_reported_as_redis_holds_it(
    redis_url, redis_client, site, exporter_factory
):
    await crawl(FaultSpider, redis_url, site, paths=FAULT_PATHS)
    await live_crawl(redis_url)
    redis_client.hset("other:{hidden}:stats", "acked", 7)  # another prefix: not reported
    redis_client.set(Keys("ha", "live").paused, 1)  # as `scrapy-ha pause live` does
    seconds, micros = redis_client.time()  # as `scrapy-ha stop faults` does: after its run
    redis_client.set(Keys("ha", "faults").stop, seconds * 1000 + micros // 1000 + 1000)
    exporter = exporter_factory(redis_url)
    samples = exporter.scrape()

    assert value(samples, "scrapy_ha_redis_up") == 1
    assert value(samples, "scrapy_ha_crawls") == 2
    spiders = {dict(labels).get("spider") for _, labels in samples} - {None}
    assert spiders == {"faults", "live"}
    info = redis_client.info("memory")
    assert value(samples, "scrapy_ha_redis_memory_used_bytes") > 0
    assert value(samples, "scrapy_ha_redis_memory_max_bytes") == info["maxmemory"]
    evicted = redis_client.info("stats")["evicted_keys"]
    assert value(samples, "scrapy_ha_redis_evicted_keys_total") == evicted

    live = redis_numbers(redis_client, "live")
    expected_live = dict(pending=2, leased=1, delayed=1, dead=1, workers=1, fingerprints=5)
    assert {k: live[k] for k in expected_live} == expected_live
    for spider in ("faults", "live"):
        held = redis_numbers(redis_client, spider)
        for state in ("pending", "leased", "delayed", "dead"):
            assert value(samples, "scrapy_ha_requests", spider=spider, state=state) == held[state]
        assert value(samples, "scrapy_ha_workers", spider=spider) == held["workers"]
        assert value(samples, "scrapy_ha_fingerprints", spider=spider) == held["fingerprints"]
        for counter in ("enqueued", "filtered", "start_duplicates", "acked", "reclaimed", "poison"):
            exposed = value(samples, f"scrapy_ha_{counter}_total", spider=spider)
            assert exposed == held.get(f"stats:{counter}", 0), counter
        for field, n in held.items():  # every per-class counter Redis holds, as held
            event, _, fclass = field.removeprefix("stats:").partition(":")
            if field.startswith("stats:") and event in ("retried", "dead") and fclass:
                name = "scrapy_ha_retried_total" if event == "retried" else DEAD_LETTERED
                assert value(samples, name, spider=spider, **{"class": fclass}) == n, field
    assert value(samples, "scrapy_ha_requests", spider="faults", state="dead") == 3
    for name, labels, n in COUNTED:
        assert value(samples, name, **labels) == n, (name, labels)
    assert value(samples, "scrapy_ha_gated_domains", spider="live") == 1
    assert value(samples, "scrapy_ha_paused", spider="live") == 1
    assert value(samples, "scrapy_ha_paused", spider="faults") == 0
    # (a QA run: no figure said a crawl was stopped, and "no live worker" fired for it)
    assert value(samples, "scrapy_ha_stopped", spider="faults") == 1
    assert value(samples, "scrapy_ha_stopped", spider="live") == 0


@deferred_f_from_coro_f
async def test_a_crawl_is_found_within_the_discovery_interval_and_gone_once_flushed(
    redis_url, redis_client, exporter_factory
):
    exporter = exporter_factory(redis_url, "--rescan", "1")
    assert value(exporter.scrape(), "scrapy_ha_crawls") == 0
    await live_crawl(redis_url)
    samples = harness.wait_for(
        lambda: (s := exporter.scrape()) and value(s, "scrapy_ha_crawls") == 1 and s,
        "the exporter to find the new crawl (it rescans every second)",
        timeout=30,
        interval=0.5,
    )
    assert value(samples, "scrapy_ha_requests", spider="live", state="pending") == 2
    redis_client.script_flush()  # as after a restart or a failover: the scripts load again
    assert value(exporter.scrape(), "scrapy_ha_requests", spider="live", state="leased") == 1
    keys = Keys("ha", "live")
    redis_client.delete(*keys.all())
    # the list of crawls is still the cached one: the flushed crawl is left out all the same
    assert crawl_samples(exporter.scrape(), "live") == {}
    exporter.proc.send_signal(signal.SIGTERM)  # as systemd or docker stop it
    assert exporter.proc.wait(START_TIMEOUT) == 0


@deferred_f_from_coro_f
async def test_a_counter_past_64_bits_written_by_hand_costs_no_other_figure(
    redis_url, redis_client, exporter_factory
):
    """``HSET ha:{boom}:stats acked <400 nines>``: every scrape was a 500 (OverflowError),
    ``scrapy_ha_redis_up`` and every crawl's figures gone, every alert quiet."""
    await live_crawl(redis_url)
    huge = "9" * 400
    redis_client.hset("ha:{boom}:stats", mapping={"acked": huge, "enqueued": 3})
    redis_client.hset("ha:{live}:stats:min", f"acked:{int(time.time()) // 60}", huge)
    redis_client.hset("ha:{live}:stats", "revisit_iv_ms", huge)  # (review: the revisits')
    samples = exporter_factory(redis_url).scrape()
    assert value(samples, "scrapy_ha_redis_up") == 1
    assert value(samples, "scrapy_ha_requests", spider="live", state="pending") == 2
    assert value(samples, "scrapy_ha_enqueued_total", spider="boom") == 3
    assert value(samples, "scrapy_ha_acked_total", spider="boom") == 0  # not a count: skipped
    redis_client.hset("ha:{live}:stats", "enqueued", -5)  # (a QA run: "retried -5")
    samples = exporter_factory(redis_url).scrape()
    assert value(samples, "scrapy_ha_enqueued_total", spider="live") == 0  # no count: skipped
    shown = subprocess.run(
        [SCRAPY_HA, "--redis-url", redis_url, "status", "live"], capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr  # the rate read stats:min: OverflowError


@deferred_f_from_coro_f
async def test_a_scrape_that_names_its_metrics_gets_those(redis_url, exporter_factory):
    """``/metrics?name[]=...`` (Prometheus's client filters by the names a collector
    describes) gave nothing: the collector described none."""
    await live_crawl(redis_url)
    exporter = exporter_factory(redis_url)
    names = ("scrapy_ha_redis_up", "scrapy_ha_requests", "scrapy_ha_enqueued_total")
    base = exporter.url
    exporter.url = base + "?" + "&".join(f"name[]={n}" for n in names)
    samples = exporter.scrape()
    assert {name for name, _ in samples} == set(names)
    assert value(samples, "scrapy_ha_requests", spider="live", state="pending") == 2
    assert value(samples, "scrapy_ha_enqueued_total", spider="live") == 5
    exporter.url = base + "?name[]=scrapy_ha_revisits_total"  # a continuous crawl's family
    assert exporter.scrape() == {}  # (none is continuous): nothing, and no error
    exporter.url = base
    assert len({name for name, _ in exporter.scrape()}) > 20  # no name: every metric


@deferred_f_from_coro_f
async def test_another_prefix_is_another_set_of_crawls(redis_url, exporter_factory):
    await live_crawl(redis_url)
    await live_crawl(redis_url, prefix="staging")
    await live_crawl(redis_url, prefix="st*")  # a prefix with a glob character
    exporter = exporter_factory(redis_url, "--prefix", "st*")  # a glob would match staging
    samples = exporter.scrape()
    assert value(samples, "scrapy_ha_crawls") == 1
    assert value(samples, "scrapy_ha_requests", spider="live", state="pending") == 2


@pytest.mark.long
def test_two_real_workers_count_once_and_a_killed_one_shows_as_leases_lost(
    redis_url, site_factory, tmp_path, exporter_factory
):
    pages, per_page = 60, 10
    site = site_factory(
        "--pages", str(pages), "--per-page", str(per_page), "--delay", "0.2", "--chains", "6"
    )
    exporter = exporter_factory(redis_url, "--rescan", "1")
    items = tmp_path / "items.jl"
    victim = worker(redis_url, site.url, items, tmp_path / "victim.log")
    wait_for_items(items, 1, victim)
    survivor = worker(redis_url, site.url, items, tmp_path / "survivor.log")
    both = harness.wait_for(
        lambda: (
            (s := crawl_samples(exporter.scrape(), "catalogue"))
            and value(s, "scrapy_ha_workers", spider="catalogue") == 2
            and s
        ),
        "both workers in the exporter's numbers",
        timeout=120,
        interval=0.2,
    )
    assert value(both, "scrapy_ha_requests", spider="catalogue", state="leased") > 0
    victim.send_signal(signal.SIGKILL)  # its leases expire: the survivor reclaims them
    victim.wait()
    assert survivor.wait(timeout=180) == 0, (tmp_path / "survivor.log").read_text()[-3000:]

    done = exporter.scrape()
    requests = 1 + pages + pages * per_page  # the home page, list pages, items
    # each request counted once however many workers handled it, nothing lost
    for name in ("enqueued", "acked"):
        assert value(done, f"scrapy_ha_{name}_total", spider="catalogue") == requests, name
    # the survivor's start request, and children of the pages the victim left unfinished
    assert value(done, "scrapy_ha_start_duplicates_total", spider="catalogue") >= 1
    assert value(done, "scrapy_ha_reclaimed_total", spider="catalogue") > 0
    assert value(done, "scrapy_ha_workers", spider="catalogue") == 0
    for state in ("pending", "leased", "delayed", "dead"):
        assert value(done, "scrapy_ha_requests", spider="catalogue", state=state) == 0


def test_retries_and_dead_letters_per_class_add_up_to_their_totals():
    stats = {"retried": 7, "retried:server": 4, "retried:network": 1, "dead": 2, "dead:gone": 2}
    numbers = CrawlNumbers(CrawlStats(0, 0, 0, 0, 0, 0, 0, spider="s", counters=stats), 0)
    assert numbers.by_class("retried") == {"server": 4, "network": 1, UNKNOWN_CLASS: 2}
    assert numbers.by_class("dead") == {"gone": 2}
    assert numbers.by_class("nothing") == {}


def test_redis_down_or_frozen_answers_redis_up_0_within_a_bounded_time(
    tmp_path: Path, exporter_factory
):
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        exporter = exporter_factory(server.url, "--timeout", "1")
        assert value(exporter.scrape(), "scrapy_ha_redis_up") == 1
        assert server.proc is not None
        server.proc.send_signal(signal.SIGSTOP)  # accepts connections, never answers
        assert scrape_within(exporter) == {("scrapy_ha_redis_up", frozenset()): 0}
        server.stop()
        assert scrape_within(exporter) == {("scrapy_ha_redis_up", frozenset()): 0}
        server.start()
        assert value(exporter.scrape(), "scrapy_ha_redis_up") == 1
    finally:
        server.stop()


def scrape_within(exporter: Exporter) -> Samples:
    """A scrape that must answer before DOWN_DEADLINE (the HTTP read times out after it)."""
    started = time.monotonic()
    samples = exporter.scrape(timeout=DOWN_DEADLINE)
    assert time.monotonic() - started < DOWN_DEADLINE
    return samples


def test_a_port_in_use_fails_naming_the_port(redis_url):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = subprocess.run(
            [SCRAPY_HA, "--redis-url", redis_url, "metrics", "--port", port],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "--port" in result.stderr


def test_a_timeout_of_zero_is_refused_naming_the_option(redis_url):
    result = subprocess.run(
        [SCRAPY_HA, "--redis-url", redis_url, "metrics", "--timeout", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "argument --timeout: '0' is not a number of seconds above 0 and at most" in result.stderr
