"""``scrapy-ha workers``: the live workers of a real crawl, as each one publishes itself."""

from __future__ import annotations

import json
import signal
import socket
from types import SimpleNamespace

import pytest
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.demo import harness
from scrapy_ha.scheduler.session.renewal import Renewals
from tests.cli_seed import renew, scrapy_ha
from tests.test_crash import wait_for_items, worker


def test_workers_shows_what_each_renewal_publishes(redis_url, redis_client):
    """The short version: the renewal a worker's keeper makes, read by the command."""
    worker_id = f"{socket.gethostname()}:4242:job7:a1b2c3"
    renew(redis_url, "books", worker_id, [("1", "t-1"), ("2", "t-2")], rate=3.5)
    (row,) = json.loads(scrapy_ha("workers", "books", "--json", "--redis-url", redis_url).stdout)
    assert (row["host"], row["pid"], row["job"]) == (socket.gethostname(), 4242, "job7")
    assert (row["leases"], row["pages_per_s"]) == (2, 3.5)
    assert 0 <= row["heartbeat_age_s"] < 60
    redis_client.zadd("ha:{books}:workers", {worker_id: 1}, xx=True)  # its heartbeat expired
    renew(redis_url, "books", "other:1:x", [], rate=0)  # any renewal sweeps it away
    assert not redis_client.hexists("ha:{books}:wstats", worker_id)


@pytest.mark.long  # a real worker, about a minute: `make test-long`
def test_workers_lists_each_live_worker_with_its_job_leases_and_rate(
    redis_url, redis_client, site_factory, tmp_path, monkeypatch
):
    site = site_factory("--pages", "60", "--per-page", "10", "--delay", "0.2")
    monkeypatch.setenv("SCRAPY_JOB", "job42")  # what scrapyd gives a crawl
    items = tmp_path / "items.jl"
    live = worker(redis_url, site.url, items, tmp_path / "worker.log")
    try:
        wait_for_items(items, 20, live)

        def published() -> list[dict[str, object]] | None:
            out = scrapy_ha("workers", "catalogue", "--json", "--redis-url", redis_url)
            rows = json.loads(out.stdout)
            return rows if rows and rows[0]["pages_per_s"] else None

        (row,) = harness.wait_for(published, "the worker's stats", timeout=60)
        assert (row["host"], row["pid"], row["job"]) == (
            socket.gethostname(),
            live.pid,
            "job42",
        )
        assert row["id"].startswith(f"{socket.gethostname()}:{live.pid}:job42:")
        assert isinstance(row["leases"], int) and row["leases"] >= 0
        assert row["pages_per_s"] > 0 and 0 <= row["heartbeat_age_s"] < 60
        table = scrapy_ha("workers", "catalogue", "--redis-url", redis_url).stdout.splitlines()
        assert table[0].split() == [
            "HOST",
            "PID",
            "JOB",
            "HEARTBEAT",
            "AGO",
            "LEASES",
            "PAGES/S",
            "WORKER",
        ]
        assert table[1].split()[:3] == [socket.gethostname(), str(live.pid), "job42"]
        assert table[-1] == "1 live worker"
    finally:
        live.send_signal(signal.SIGINT)
        live.wait(60)
    assert scrapy_ha("workers", "catalogue", "--redis-url", redis_url).stdout.strip() == (
        "no live worker of catalogue"
    )
    assert not redis_client.hlen("ha:{catalogue}:wstats")  # it left: its stats went with it


def test_a_worker_id_of_the_users_own_is_shown_as_it_is(redis_url, redis_client):
    redis_client.zadd("ha:{books}:workers", {"crawler-7": 2**41})
    out = scrapy_ha("workers", "books", "--json", "--redis-url", redis_url).stdout
    assert json.loads(out) == [
        {
            "id": "crawler-7",
            "host": None,
            "pid": None,
            "job": None,
            "heartbeat": None,
            "heartbeat_age_s": None,
            "leases": None,
            "pages_per_s": None,
            "silent": False,
        }
    ]


def test_the_dashboard_gives_a_pid_as_a_number_and_shows_a_dash_where_the_id_has_none(
    redis_url, redis_client
):
    """``workers --json`` and the API gave the pid as text (``"4242"``)."""
    from tests.test_dashboard_api import dashboard

    renew(redis_url, "books", "host-a:4242:x1", [("1", "t-1")], rate=1.0)
    redis_client.zadd("ha:{books}:workers", {"crawler-7": 2**41})
    with dashboard(redis_url) as http:
        rows = http.get("/api/crawls/books").json()["workers_live"]
        assert sorted((r["id"], r["host"], r["pid"], r["job"]) for r in rows) == [
            ("crawler-7", None, None, None),
            ("host-a:4242:x1", "host-a", 4242, None),
        ]
        page = http.get("/crawls/books").text
    assert '<td>host-a</td><td class="n">4242</td>' in page
    assert '<td>-</td><td class="n">-</td>' in page and "None" not in page


def test_workers_written_by_hand_do_not_break_the_listing(redis_url, redis_client):
    """A heartbeat of ``inf``, an id not UTF-8 and stats that are not figures made
    ``workers`` fail with a traceback."""
    renew(redis_url, "books", "host-a:4242:x1", [("1", "t-1")], rate=1.0)
    redis_client.zadd("ha:{books}:workers", {"w-inf": float("inf"), b"\xff\xfe": 2**41})
    redis_client.hset("ha:{books}:wstats", "w-inf", '123 {"leases": "x", "rate": [1]}')
    redis_client.hset("ha:{books}:wstats", "host-a:4242:x1", '99999999999999999999 {"leases": 1}')
    shown = scrapy_ha("workers", "books", "--redis-url", redis_url)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[-1] == "3 live workers", shown.stdout
    rows = json.loads(scrapy_ha("workers", "books", "--json", "--redis-url", redis_url).stdout)
    assert {r["id"]: r["leases"] for r in rows}["w-inf"] is None


def test_a_worker_silent_for_most_of_its_heartbeats_life_is_pointed_out(redis_url, redis_client):
    """A worker SIGKILLed was listed as any other until its heartbeat expired (walkthrough)."""
    seconds, micros = redis_client.time()
    now = seconds * 1000 + micros // 1000
    # (heartbeats that outlive a slow run: host-a's expired within 5 s, and a busy machine's
    # second `workers` call no longer listed it)
    workers = [
        ("host-a:1:x", 250_000, 50_000, ""),  # a worker that does not say its interval
        ("host-b:2:x", 1_000, 299_000, ""),
        ("host-c:3:x", 21_000, 300_000, ', "every": 25'),  # renews every 25 s: not yet (review)
        ("host-d:4:x", 21_000, 300_000, ', "every": 10'),
    ]
    for wid, ago, left, every in workers:
        redis_client.zadd("ha:{books}:workers", {wid: now + left})
        redis_client.hset("ha:{books}:wstats", wid, f'{now - ago} {{"leases": 3{every}}}')
    shown = scrapy_ha("workers", "books", "--redis-url", redis_url)
    assert shown.returncode == 0, shown.stderr
    said = [line for line in shown.stdout.splitlines() if " has been silent for " in line]
    assert [line.split()[0] for line in said] == ["host-a:1:x", "host-d:4:x"], said
    rows = json.loads(scrapy_ha("workers", "books", "--json", "--redis-url", redis_url).stdout)
    assert {r["id"]: r["silent"] for r in rows} == {
        "host-a:1:x": True,
        "host-b:2:x": False,
        "host-c:3:x": False,
        "host-d:4:x": True,
    }


def test_the_table_keeps_its_columns_in_line_with_scrapyd_job_ids(redis_url):
    """A scrapyd job id is 32 characters: the JOB column was 14 wide, and every column after
    it went out of line under scrapyd (a QA run)."""
    host = socket.gethostname()
    job = "f28f1dfaf15311f181b702fc00000001"
    renew(redis_url, "books", f"{host}:4242:{job}:a1b2c3", [("1", "t-1")], rate=3.5)
    renew(redis_url, "books", f"{host}:77:-:d4e5f6", [], rate=1)
    header, *rows, last = scrapy_ha("workers", "books", "--redis-url", redis_url).stdout.split(
        "\n"
    )[:-1]
    assert last == "2 live workers" and len(rows) == 2
    for column in ("JOB", "HEARTBEAT", "WORKER"):
        at = header.index(column)
        assert all(row[at - 1] == " " and row[at] != " " for row in rows), (header, rows)
    assert any(row.split()[2] == job for row in rows)


def test_a_scrapyd_job_id_with_colons_keeps_the_host_pid_and_job_apart(redis_url):
    """scrapyd takes any ``jobid`` (``schedule.json -d jobid=nightly:r2:a``): an id of more
    than four parts was shown as one of the user's own, host, pid and job ``-``."""
    host = socket.gethostname()
    renew(redis_url, "books", f"{host}:4242:nightly:r2:a:a1b2c3", [("1", "t-1")], rate=2.0)
    (row,) = json.loads(scrapy_ha("workers", "books", "--json", "--redis-url", redis_url).stdout)
    assert (row["host"], row["pid"], row["job"]) == (host, 4242, "nightly:r2:a")
    (line,) = scrapy_ha("workers", "books", "--redis-url", redis_url).stdout.splitlines()[1:2]
    assert line.split()[:3] == [host, "4242", "nightly:r2:a"], line


def test_a_worker_whose_rate_is_not_measured_yet_shows_a_dash_not_zero(redis_url):
    """A QA run: a worker that had crawled for 8 s showed ``PAGES/S 0`` beside another one at
    8 pages/s, as if it were stuck. Its rate is measured between two renewals, so a worker
    publishes none before that, and the command shows ``-`` until it has one."""
    renew(redis_url, "books", "host-a:4242:x1", [("1", "t-1")], rate=None)
    (row,) = json.loads(scrapy_ha("workers", "books", "--json", "--redis-url", redis_url).stdout)
    assert row["pages_per_s"] is None
    table = scrapy_ha("workers", "books", "--redis-url", redis_url).stdout.splitlines()
    assert table[1].split()[-2:] == ["-", "host-a:4242:x1"]


@deferred_f_from_coro_f
async def test_a_worker_publishes_its_rate_only_once_it_measured_one():
    """The first renewal (at connect) has no earlier one to measure the rate from: it
    publishes none; the next one, a renewal interval later, publishes what it measured."""
    config = SimpleNamespace(worker_id="w", lease_time=30, heartbeat_ttl=30, renew_interval=0)
    queue = _RatesSeen()
    state = Renewals(Settings(), lambda: config, held=tuple, on_lost=lambda lost: None)
    await state.renew(queue)
    state.acked = 5
    await state.renew(queue)
    await state.renew(queue)
    assert queue.rates[0] is None
    assert queue.rates[1] is None  # what the first renewal knew when it sent the second
    assert queue.rates[2] is not None and queue.rates[2] > 0


class _RatesSeen:
    """A queue that records the rate each renewal publishes."""

    live_workers = 1

    def __init__(self) -> None:
        self.rates: list[float | None] = []

    async def renew(self, pairs, *, rate, **kwargs):
        self.rates.append(rate)
        return 0, []
