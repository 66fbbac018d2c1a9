"""What one payload may cost the worker that reads it: its size, its nesting and the hash
collisions of its sets and dicts are bounded; an entry over a bound is dead-lettered as
corrupt with the reason, alone, and a worker never stores what it would refuse to read."""

from __future__ import annotations

import json

import pytest
import scrapy
from scrapy.core.engine import ExecutionEngine
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.codec import CodecError, decode_request, encode_request
from scrapy_ha.codec.document import MAX_DEPTH, MAX_PAYLOAD_BYTES, MAX_SHARED_HASH
from scrapy_ha.keys import Keys
from tests import backqueues
from tests.spiders import FaultSpider
from tests.test_codec import SPIDER

#: Every multiple of this int has the hash 0 (int hashes are not randomised).
MODULUS = 2**61 - 1


def payload(url: str = "http://x/", **fields) -> bytes:
    return json.dumps({"v": 1, "u": url, **fields}).encode()


def colliding_meta(n: int = 4000) -> dict:
    """Sets and dicts of *n* distinct ints that all hash to 0: building each compares every
    new element with all the ones before (n * n / 2 comparisons; 16,000 took 5 s)."""
    ints = [k * MODULUS for k in range(n)]
    return {
        "set": {"__s": ints},
        "frozenset": {"__fs": ints},
        "dict": {"__d": [[i, 0] for i in ints]},
    }


def nested(depth: int) -> object:
    """A list nested so that a document holding it in meta is *depth* levels deep."""
    value: object = 1
    for _ in range(depth - 2):  # the document and meta are two levels
        value = [value]
    return value


@pytest.mark.parametrize("kind", ["set", "frozenset", "dict"])
def test_a_set_or_dict_built_to_collide_is_refused(kind):
    doc = payload(mt={"a": colliding_meta()[kind]})
    with pytest.raises(CodecError, match=f"stored {kind} holds 4000 values that share the hash"):
        decode_request(doc, SPIDER)


def test_sets_and_dicts_of_real_data_still_decode():
    # -1 and -2 share a hash, as do a few values a limit must not refuse
    values = {-1, -2, MODULUS, 2 * MODULUS, *range(100)}
    meta = {"s": values, "f": frozenset(values), "d": {(1, 2): "a", -1: "b", -2: "c", 0.5: 1}}
    request = scrapy.Request("http://x/", meta=meta)
    assert decode_request(encode_request(request, SPIDER), SPIDER).meta == meta
    shared = [k * MODULUS for k in range(MAX_SHARED_HASH)]  # at the limit: read
    assert decode_request(payload(mt={"a": {"__s": shared}}), SPIDER).meta["a"] == set(shared)


def test_a_payload_nested_deeper_than_the_limit_is_refused():
    assert decode_request(payload(mt={"a": nested(MAX_DEPTH)}), SPIDER).meta["a"]
    brackets = '[{\\"' * MAX_DEPTH  # in strings, brackets and escaped quotes nest nothing
    assert decode_request(payload(mt={"a": brackets, "b": nested(50)}), SPIDER).meta["a"]
    with pytest.raises(CodecError, match=f"nested more than {MAX_DEPTH} levels deep"):
        decode_request(payload(mt={"a": nested(MAX_DEPTH + 1)}), SPIDER)


def test_a_payload_larger_than_the_limit_is_refused():
    room = MAX_PAYLOAD_BYTES - len(payload(mt={"a": ""}))
    assert len(decode_request(payload(mt={"a": "x" * room}), SPIDER).meta["a"]) == room
    with pytest.raises(CodecError, match="MAX_PAYLOAD_BYTES"):
        decode_request(payload(mt={"a": "x" * (room + 1)}), SPIDER)


@pytest.mark.parametrize(
    ("meta", "why"),
    [
        ({"a": "x" * MAX_PAYLOAD_BYTES}, "MAX_PAYLOAD_BYTES"),
        ({"a": nested(MAX_DEPTH + 1)}, f"nested more than {MAX_DEPTH} levels"),
    ],
)
def test_a_worker_never_stores_what_it_would_refuse_to_read(meta, why):
    request = scrapy.Request("http://x/big", meta=meta)
    for policy in ("error", "drop-key"):
        with pytest.raises(CodecError, match=f"cannot store the request for http://x/big: .*{why}"):
            encode_request(request, SPIDER, unstorable=policy)


# -- in a crawl --------------------------------------------------------------------------


@pytest.fixture
def fast_engine_heartbeat(monkeypatch):
    monkeypatch.setattr(ExecutionEngine, "_SLOT_HEARTBEAT_INTERVAL", 0.2)


@deferred_f_from_coro_f
async def test_entries_over_a_limit_are_dead_lettered_alone(
    redis_url, redis_client, site, fast_engine_heartbeat
):
    keys = Keys("ha", "faults")
    entries = {
        "900": payload(site.url + "/item/2", cb="parse", mt=colliding_meta()),
        "901": payload(site.url + "/item/3", cb="parse", mt={"a": nested(MAX_DEPTH + 1)}),
        "902": payload(site.url + "/item/4", cb="parse", mt={"a": "x" * MAX_PAYLOAD_BYTES}),
        "903": payload(site.url + "/item/5", cb="parse", mt={"a": nested(MAX_DEPTH)}),
    }
    backqueues.plant(redis_client, keys, list(entries.items()))
    settings = {
        "SCHEDULER": "scrapy_ha.Scheduler",
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.3,
        "SCHEDULER_PERSIST": True,
    }
    crawler = get_crawler(FaultSpider, settings)
    await crawler.crawl_async(base_url=site.url, paths=("/item/1",))
    assert sorted(crawler.spider.ok) == ["/item/1", "/item/5"]
    assert crawler.stats.get_value("ha/dead/corrupt") == 3
    dead = {k.decode(): json.loads(v) for k, v in redis_client.hgetall(keys.dead_info).items()}
    assert {k: d["class"] for k, d in dead.items()} == dict.fromkeys(
        ("900", "901", "902"), "corrupt"
    )
    assert "MAX_SHARED_HASH" in dead["900"]["reason"]
    assert "MAX_DEPTH" in dead["901"]["reason"]
    assert "MAX_PAYLOAD_BYTES" in dead["902"]["reason"]
