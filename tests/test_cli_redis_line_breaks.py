"""What someone else wrote to Redis cannot break a listing's lines: a URL, a failure class
or a domain holding a carriage return or a newline is shown on its entry's line (the
return wrote the rest over the line's start in a terminal, the newline made a line that
read as another entry), as `visible` already shows what a terminal would act on."""

from __future__ import annotations

import json
import time

import redis

from tests.cli_seed import scrapy_ha

SPIDER = "lines"
FORGED_URL = "http://evil.example/admin?drop=all\rhttp://shop.example/page/1"
FORGED_CLASS = "gone\nfake-class 99"
FORGED_DOMAIN = "shop.example\n               other.example"


def plant(client: redis.Redis) -> None:
    """A dead letter with a forged URL and class, and a domain counter, as a Redis writer
    would leave them (fields as scrapy-ha writes them)."""
    key = "ha:{" + SPIDER + "}"
    doc = {"v": 1, "u": FORGED_URL}
    client.hset(f"{key}:payload", "7", json.dumps(doc))
    info = {
        "class": FORGED_CLASS,
        "reason": "HTTP 404",
        "attempts": 1,
        "status": 404,
        "first": 1,
        "last": 1,
        "history": [],
    }
    client.hset(f"{key}:dead_info", "7", json.dumps(info))
    client.zadd(f"{key}:dead", {"7": int(time.time() * 1000)})
    client.hset(f"{key}:stats", mapping={"dead": 1, f"dead:{FORGED_CLASS}": 1})
    client.hset(f"{key}:stats:domain", f"{FORGED_DOMAIN}\tdead", 1)


def test_dlq_list_and_status_keep_each_entry_on_its_line(redis_url):
    client = redis.Redis.from_url(redis_url)
    plant(client)
    listed = scrapy_ha("dlq", "list", SPIDER, "--redis-url", redis_url)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()  # (text mode reads a lone \r as a line's end too)
    assert len(lines) == 3, lines  # the header, the entry, the total
    assert lines[1].endswith(" http://evil.example/admin?drop=all http://shop.example/page/1")
    assert lines[2] == "1 entry listed (gone fake-class 99 1)"
    status = scrapy_ha("status", SPIDER, "--redis-url", redis_url)
    assert status.returncode == 0, status.stderr
    assert "dead-lettered  1 (gone fake-class 99 1)" in status.stdout.splitlines()
    domains = status.stdout.split("top domains\n", 1)[1].splitlines()
    assert domains[1].split() == ["shop.example", "other.example", "0", "0", "0", "1"]
    assert not domains[2].strip().startswith("other.example")
    report = scrapy_ha("report", SPIDER, "--since", "24h", "--redis-url", redis_url)
    assert report.returncode == 0, report.stderr
    assert "dead by class:  gone fake-class 99 1" in report.stdout.splitlines()
    client.close()
