"""`scrapy-ha report` of a large dead-letter queue reads it by rank, as `dlq list` does: the
walk by score with ``LIMIT offset`` walked the offset entry by entry at every call (a QA run:
a report of 300,000 dead letters held Redis, and every worker, 29 s in 554 calls of up to
150 ms). The window's edges still count exactly."""

from __future__ import annotations

import json

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
    assert not [c for c in commands if c.upper().startswith("ZRANGEBYSCORE") and key in c]
    everything = scrapy_ha(
        "report", "wide", "--since", "7d", "--format", "json", "--redis-url", redis_url
    )
    assert json.loads(everything.stdout)["window"]["dead"] == 1300
