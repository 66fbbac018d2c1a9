"""`scrapy-ha report` reads the workers seen at the instant it reads the states. It read them
after walking the dead letters, against the time read before: a QA run's walk of 300,000
took over a minute, the live worker's heartbeat was renewed past that time plus a minute
meanwhile, and the report said "workers seen: 0" beside "workers 1"."""

from __future__ import annotations

import json
import threading

import redis

from tests.cli_seed import dead_letters, renew, scrapy_ha


def _heartbeat_during_the_walk(redis_url: str, key: str, worker: str, ready: threading.Event):
    """Once the report reads the dead letters, the worker heartbeats as it would two minutes
    later (the walk of a large queue takes that long)."""
    client = redis.Redis.from_url(redis_url)
    with client.monitor() as monitor:
        ready.set()
        for command in monitor.listen():
            if (
                command["command"].upper().startswith("ZRANGE")
                and "{wide}:dead" in command["command"]
            ):
                break
    seconds, micros = client.time()
    client.zadd(key, {worker: seconds * 1000 + micros // 1000 + 120_000})
    client.close()


def test_a_worker_heartbeating_during_the_report_is_seen(redis_url):
    dead_letters(redis_url, "wide", [(f"http://h.example/{i}", "gone", 404) for i in range(600)])
    renew(redis_url, "wide", "host:1:w", [], 1.0)  # a live worker's heartbeat
    ready = threading.Event()
    thread = threading.Thread(
        target=_heartbeat_during_the_walk,
        args=(redis_url, "ha:{wide}:seen", "host:1:w", ready),
    )
    thread.start()
    ready.wait(10)
    report = scrapy_ha("report", "wide", "--format", "json", "--redis-url", redis_url)
    thread.join(10)
    assert report.returncode == 0, report.stderr
    out = json.loads(report.stdout)
    assert out["window"]["dead"] == 600
    assert out["states"]["workers"] == 1
    assert out["workers_seen"] == ["host:1:w"], out["workers_seen"]
