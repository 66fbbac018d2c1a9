"""A Bloom filter's meta hash (``ha:{S}:bloom``) that scrapy-ha cannot have written costs
its crawl alone, named at once: the exporter's ``scrapy_ha_crawl_read_error 1`` and
``scrapy-ha status``'s ``error:`` with exit code 2, never a hang nor a traceback. A real
redis-server, the real exporter's collector and command."""

from __future__ import annotations

import subprocess

import pytest
import redis
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.ops.metrics import CrawlCollector
from tests.test_cli import SCRAPY_HA
from tests.test_metrics import live_crawl
from tests.test_unreadable_names import FIX, _samples

#: Meta hashes whose layout would have a reader count parts for ever, and why each is refused.
HUGE = [
    # 40 layers of 1e6 URLs in parts of 64 MB: ~10^25 parts in all
    (
        {"capacity": 1000000, "k": 8, "part": 67108864, "layers": 40},
        "layer 18 of capacity 1000000 and k 8 would hold more than 1099511627776 bytes",
    ),
    # one layer of 10^10 URLs in parts of 1 byte: ~10^11 parts
    (
        {"capacity": 10**10, "k": 8, "part": 1, "layers": 1},
        "layer 0 would have more than 65536 parts of 1 bytes",
    ),
    # a capacity no float holds
    (
        {"capacity": "9" * 400, "k": 8, "part": 4096, "layers": 1},
        f"layer 0 of capacity {'9' * 400} and k 8 would hold more than 1099511627776 bytes",
    ),
]


def _status(redis_url: str, spider: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCRAPY_HA, "status", spider, "--redis-url", redis_url],
        capture_output=True,
        text=True,
        timeout=60,  # a safety net: the answer comes at once
    )


@pytest.mark.parametrize(("meta", "why"), HUGE)
@deferred_f_from_coro_f
async def test_a_bloom_layout_of_too_many_bytes_or_parts_is_refused_not_counted(
    redis_url, meta, why
):
    await live_crawl(redis_url)
    client = redis.Redis.from_url(redis_url)
    client.hset("ha:{huge}:stats", "acked", 1)
    client.hset("ha:{huge}:bloom", mapping=meta)
    done = _status(redis_url, "huge")
    assert done.returncode == 2, done.stderr
    reason = f"cannot read the crawl huge: unreadable Bloom filter meta: {why}"
    assert done.stderr == f"error: {reason}{FIX}\n"
    samples = _samples(CrawlCollector(client, "ha", discovery_ttl=0))
    assert samples[("scrapy_ha_requests", ("live", "pending"))] == 2
    assert samples[("scrapy_ha_crawl_read_error", ("huge",))] == 1
    client.close()


#: A filter of one layer, as scrapy-ha writes it, that each case below spoils by one field.
ONE_LAYER = {"capacity": 1000, "k": 8, "part": 4096, "layers": 1, "n:0": 3, "error": 0.01}
#: Its time slices (HA_DUPEFILTER_TTL): slot 0 started at 1 ms, one layer.
SLICED = {"capacity": 1000, "k": 8, "part": 4096, "period": 10**12, "s0": 1, "l0": 1}
SPOILT = [
    ({**ONE_LAYER, "error": "abc"}, "error is 'abc', not a finite number of 0 or more"),
    ({**ONE_LAYER, "fp": "x"}, "fp is 'x', not a finite number of 0 or more"),
    ({**ONE_LAYER, "fp": "nan"}, "fp is 'nan', not a finite number of 0 or more"),
    ({**ONE_LAYER, "n:0": "x"}, "n:0 is 'x', not a whole number of 0 or more"),
    ({**SLICED, "s0": "x"}, "s0 is 'x', not a whole number of 0 or more"),
    ({**SLICED, "n0:0": "-1"}, "n0:0 is '-1', not a whole number of 0 or more"),
    # a QA run: the scripts refuse a count 'n' that is not a whole number (every worker then
    # stored nothing), where status read it as 'fingerprints 0' (or -3) and a sound filter
    ({**ONE_LAYER, "n": "abc"}, "n is 'abc', not a whole number of 0 or more"),
    ({**SLICED, "n": "-3"}, "n is '-3', not a whole number of 0 or more"),
    # a QA run: no dupefilter line at all, where the reference says unreadable
    ({k: v for k, v in ONE_LAYER.items() if k != "capacity"}, "no field 'capacity'"),
]


@pytest.mark.parametrize(("meta", "why"), SPOILT)
@deferred_f_from_coro_f
async def test_every_field_of_a_bloom_meta_is_read_through_a_check(redis_url, meta, why):
    client = redis.Redis.from_url(redis_url)
    client.hset("ha:{spoilt}:stats", "acked", 1)
    client.hset("ha:{spoilt}:bloom", mapping=meta)
    done = _status(redis_url, "spoilt")
    assert done.returncode == 2, done.stderr
    reason = f"cannot read the crawl spoilt: unreadable Bloom filter meta: {why}"
    assert done.stderr == f"error: {reason}{FIX}\n"
    samples = _samples(CrawlCollector(client, "ha", discovery_ttl=0))
    assert samples[("scrapy_ha_crawl_read_error", ("spoilt",))] == 1
    client.close()


@pytest.mark.parametrize("meta", [ONE_LAYER, SLICED])
def test_the_unspoilt_filters_read(redis_url, redis_client, meta):
    redis_client.hset("ha:{fine}:stats", "acked", 1)
    redis_client.hset("ha:{fine}:bloom", mapping=meta)
    done = _status(redis_url, "fine")
    assert done.returncode == 0, done.stderr
    assert "Bloom" in done.stdout or "bloom" in done.stdout, done.stdout
