"""`dlq requeue` calls the requeue script for 100 entries at a time, not 500: each entry goes
back to its host's queue, and a call of 500 held Redis, and every worker's call, 29 ms in a
QA run where a worker's sync took 1 ms (100 to 135 ms on a loaded machine)."""

from __future__ import annotations

import hashlib
import threading

import redis

from scrapy_ha.store.scripts import script_text
from tests.cli_seed import dead_letters, scrapy_ha

KEYS = 15  # the requeue script's (lua/requeue.lua)


def _watch_requeues(redis_url: str, sizes: list[int], ready: threading.Event) -> None:
    """The entries each call of the requeue script carried (its quadruples), until the
    command's last call, read from MONITOR."""
    sha = hashlib.sha1(script_text("requeue").encode()).hexdigest()
    client = redis.Redis.from_url(redis_url)
    with client.monitor() as monitor:
        ready.set()
        for command in monitor.listen():
            words = command["command"].split()
            if words[:2] == ["EVALSHA", sha]:  # (redis-py loads it first: SCRIPT LOAD)
                sizes.append((len(words) - 3 - KEYS) // 4)
                if sum(sizes) >= 300:
                    break
    client.close()


def test_a_requeue_of_300_dead_letters_calls_the_script_100_at_a_time(redis_url, redis_client):
    dead_letters(redis_url, "wide", [(f"http://h{i}.example/{i}", "gone", 404) for i in range(300)])
    sizes: list[int] = []
    ready = threading.Event()
    thread = threading.Thread(target=_watch_requeues, args=(redis_url, sizes, ready))
    thread.start()
    ready.wait(10)
    done = scrapy_ha("dlq", "requeue", "wide", "--all", "-y", "--redis-url", redis_url)
    thread.join(20)
    assert done.returncode == 0, done.stderr
    assert "requeued 300 of 300 entries" in done.stdout, done.stdout
    assert redis_client.zcard("ha:{wide}:dead") == 0
    assert sum(sizes) == 300, sizes
    assert max(sizes) <= 100, sizes
