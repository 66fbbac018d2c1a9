"""`scrapy-ha status` (and the dashboard's crawl page, the same reader) of a broad crawl: the
per-domain counts (4 fields a domain in ``ha:{S}:stats:domain``) are read a slice at a time.
One ``HGETALL`` of a QA run's 10,000 domains held Redis, and every worker, for 100 ms at
each status; a crawl of a million hosts would have held it for seconds."""

from __future__ import annotations

import asyncio
import json

import redis
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.keys import Keys
from scrapy_ha.ops.stats import read_crawl_stats
from tests.cli_seed import dead_letters, scrapy_ha

DOMAINS = 12_000


def _broad_crawl(redis_url: str, spider: str) -> redis.Redis:
    """A crawl in Redis (one dead letter) whose per-domain counts name DOMAINS hosts, host
    ``d<i>.example`` with ``i`` pages acked."""
    dead_letters(redis_url, spider, [("https://d0.example/gone", "gone", 404)])
    client = redis.Redis.from_url(redis_url)
    key = Keys("ha", spider).stats_domains
    for start in range(0, DOMAINS, 2000):
        fields = {f"d{i}.example\tacked": i for i in range(start, start + 2000)}
        client.hset(key, mapping=fields)
    return client


def _commands_on(client: redis.Redis, key: str) -> list[str]:
    """The commands the server ran on *key* since the slow log was reset (every command is
    logged: ``slowlog-log-slower-than 0``)."""
    return [
        e["command"].decode().split()[0].upper()
        for e in client.slowlog_get(100_000)
        if key.encode() in e["command"]
    ]


def _logging_every_command(client: redis.Redis) -> tuple[bytes, bytes]:
    before = client.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"]
    length = client.config_get("slowlog-max-len")["slowlog-max-len"]
    client.config_set("slowlog-log-slower-than", 0)
    client.config_set("slowlog-max-len", 100_000)
    client.slowlog_reset()
    return before, length


@deferred_f_from_coro_f
async def test_status_reads_the_domains_a_slice_at_a_time(redis_url):
    client = _broad_crawl(redis_url, "broad")
    key = Keys("ha", "broad").stats_domains
    before, length = _logging_every_command(client)
    try:
        status = await asyncio.to_thread(
            scrapy_ha, "status", "broad", "--json", "--domains", "3", "--redis-url", redis_url
        )
        commands = _commands_on(client, key)
    finally:
        client.config_set("slowlog-log-slower-than", before)
        client.config_set("slowlog-max-len", length)
    assert status.returncode == 0, status.stderr
    top = json.loads(status.stdout)["domains"]
    assert [(d["domain"], d["acked"]) for d in top] == [
        (f"d{i}.example", i) for i in (DOMAINS - 1, DOMAINS - 2, DOMAINS - 3)
    ]
    assert "HGETALL" not in commands, commands[:5]
    assert commands.count("HSCAN") > 1, commands[:5]  # (4 fields a domain, read in slices)
    client.close()


def test_the_blocking_reader_sums_every_domain(redis_url):
    """``scrapy_ha.stats.read_crawl_stats`` (a sync client) reads every domain's counts."""
    client = _broad_crawl(redis_url, "broad2")
    stats = read_crawl_stats(client, Keys("ha", "broad2"))
    assert len(stats.domains) == DOMAINS
    assert stats.domains["d0.example"] == {"enqueued": 1, "dead": 1, "acked": 0}
    assert stats.domains[f"d{DOMAINS - 1}.example"]["acked"] == DOMAINS - 1
    assert sum(e.get("acked", 0) for e in stats.domains.values()) == sum(range(DOMAINS))
    client.close()
