"""A worker's memory check (scheduler.session.pressure) reads used_memory and maxmemory from
INFO as the server sends it, without redis-py parsing the whole reply, and holds back, then
goes on, at the marks."""

from __future__ import annotations

from types import SimpleNamespace

import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.config.memory import MemoryConfig
from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.remote import Remote
from scrapy_ha.scheduler.session.pressure import Pressure, _read

#: maxmemory set for the test: far above what the test server uses.
MAXMEMORY = 1 << 30


def _counting_info(client: redis.asyncio.Redis) -> list[object]:
    """Record each INFO reply redis-py parses on *client* (its response callback)."""
    parsed: list[object] = []
    parse = client.response_callbacks["INFO"]

    def counted(response: object, **options: object) -> object:
        parsed.append(response)
        return parse(response, **options)

    client.response_callbacks["INFO"] = counted
    return parsed


@deferred_f_from_coro_f
async def test_the_check_reads_the_two_fields_without_parsing_info(redis_url):
    client = redis.asyncio.Redis.from_url(redis_url)
    old = (await client.config_get("maxmemory"))["maxmemory"]
    await client.config_set("maxmemory", MAXMEMORY)
    try:
        parsed = _counting_info(client)
        [(used, most)] = await _read(client)
        assert parsed == []
        info = await client.info("memory")
        assert most == info["maxmemory"] == MAXMEMORY
        assert 0 < used and abs(used - info["used_memory"]) < 1 << 20
        remote = Remote()
        crawler = get_crawler()
        crawler.stats.open_spider()
        pressure = Pressure(MemoryConfig(high=used / 2, low=used / 4), crawler.stats, remote, "r")
        queue = SimpleNamespace(client=client, keys=Keys("ha", "pressure"))
        await pressure.check(queue, now=0.0)  # above the high mark: held back
        assert remote.held and len(parsed) == 1  # the INFO of the test's own read only
        pressure.config = MemoryConfig(high=used * 4, low=used * 2)
        await pressure.check(queue, now=10.0)  # below the low mark: goes on
        assert not remote.held
    finally:
        await client.config_set("maxmemory", old)
        await client.aclose()
