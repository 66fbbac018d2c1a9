"""``scrapy-ha workers``: the live workers of a real crawl, as each one publishes itself."""

from __future__ import annotations

import json
import signal
import socket

from scrapy_ha.demo import harness
from tests.cli_seed import scrapy_ha
from tests.test_crash import wait_for_items, worker


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
            str(live.pid),
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
            "host": "-",
            "pid": "-",
            "job": "-",
            "heartbeat": None,
            "heartbeat_age_s": None,
            "leases": None,
            "pages_per_s": None,
        }
    ]
