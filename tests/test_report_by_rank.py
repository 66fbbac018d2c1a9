"""`scrapy-ha report` of a large dead-letter queue reads it by rank, as `dlq list` does: the
walk by score with ``LIMIT offset`` walked the offset entry by entry at every call (a QA run:
a report of 300,000 dead letters held Redis, and every worker, 29 s in 554 calls of up to
150 ms). The window's edges still count exactly."""

from __future__ import annotations

import json
import threading
import time

from tests.cli_seed import dead_letters, scrapy_ha

DAY_MS = 24 * 3600 * 1000


def test_the_report_reads_the_dead_letters_by_rank_and_counts_its_window(redis_url, redis_client):
    rows = [
        (f"http://h{i % 7}.example/{i}", "gone" if i % 3 else "server", 404) for i in range(1300)
    ]
    dead_letters(redis_url, "wide", rows)
    key = "ha:{wide}:dead"
    old = redis_client.zrange(key, 0, 249, withscores=True)  # 250 dead two days ago
    redis_client.zadd(key, {member: score - 2 * DAY_MS for member, score in old}, xx=True)
    before = redis_client.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"]
    length = redis_client.config_get("slowlog-max-len")["slowlog-max-len"]
    redis_client.config_set("slowlog-log-slower-than", 0)  # every command logged
    redis_client.config_set("slowlog-max-len", 100_000)
    redis_client.slowlog_reset()
    try:
        report = scrapy_ha("report", "wide", "--format", "json", "--redis-url", redis_url)
        commands = [e["command"].decode() for e in redis_client.slowlog_get(100_000)]
    finally:
        redis_client.config_set("slowlog-log-slower-than", before)
        redis_client.config_set("slowlog-max-len", length)
    assert report.returncode == 0, report.stderr
    out = json.loads(report.stdout)
    assert out["window"]["dead"] == 1050
    in_window = [fclass for _, fclass, _ in rows[250:]]  # (seeded in order: the oldest first)
    gone = sum(1 for fclass in in_window if fclass == "gone")
    assert out["dead_by_class"] == {"gone": gone, "server": 1050 - gone}
    walks = [c.split() for c in commands if c.upper().startswith("ZRANGEBYSCORE") and key in c]
    assert walks and all(w[w.index("LIMIT") + 1] == "0" for w in walks if "LIMIT" in w)
    everything = scrapy_ha(
        "report", "wide", "--since", "7d", "--format", "json", "--redis-url", redis_url
    )
    assert json.loads(everything.stdout)["window"]["dead"] == 1300


def test_the_report_counts_its_window_while_the_queue_at_its_cap_drops_its_oldest(
    redis_url, redis_client
):
    """A QA run: a dead-letter queue at its cap drops its oldest entry as each new one comes;
    the report read by rank skipped as many of its window as were dropped meanwhile (19,780
    to 19,940 of 20,000 present throughout)."""
    key = "ha:{capped}:dead"
    now = int(time.time() * 1000)
    redis_client.set("ha:{capped}:seq", 1)  # a crawl exists
    for first in range(0, 60_000, 5_000):  # outside the window: two hours ago
        redis_client.zadd(key, {f"o{i}": now - 7_200_000 + i for i in range(first, first + 5_000)})
    redis_client.zadd(key, {f"w{i}": now - 100_000 + i for i in range(6_000)})
    done = threading.Event()

    def at_its_cap() -> None:
        i = 0
        while not done.is_set() and i < 2_900:  # (at most 58,000 of the 60,000 old ones)
            pipe = redis_client.pipeline(transaction=True)
            pipe.zadd(key, {f"n{i}-{j}": now + 10**9 for j in range(20)})  # after the window
            pipe.zpopmin(key, 20)
            pipe.execute()
            i += 1
            time.sleep(0.001)  # (for as long as the report runs)

    churn = threading.Thread(target=at_its_cap)
    churn.start()
    try:
        report = scrapy_ha(
            "report", "capped", "--since", "1h", "--format", "json", "--redis-url", redis_url
        )
    finally:
        done.set()
        churn.join()
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["window"]["dead"] == 6_000
