"""What a new URL costs Redis with the Bloom filter's time slices (``HA_DUPEFILTER_TTL``,
lua/lib/aged.lua) against the filter kept for ever: one Lua call of lib/seen (what the
scripts that enqueue run for each child) adds ``--batch`` new URLs, timed by the client
(median of ``--calls``) and by Redis (``INFO commandstats``: microseconds per call).

The slices: 9 slots, each filled to its capacity (``--capacity`` / 8 URLs) at a clock the
call is given (a TTL / 8 apart), so that a new URL reads every slot. The filter kept for
ever: ``--capacity`` URLs, its first layer full. Both at ``--error``; a fresh
redis-server for the run. Compare the two figures of one run (the machine's load moves
both).

    python bench/seen_ttl_cost.py --capacity 80000 --error 1e-6 --calls 15
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scrapy_ha.keys import SEEN_SLICES  # noqa: E402
from scrapy_ha.store import scripts  # noqa: E402
from scrapy_ha.store.aged import AgedBloom  # noqa: E402
from scrapy_ha.store.bloom import BloomFilter  # noqa: E402
from tests import redis_servers  # noqa: E402

#: ARGV: spec, now (ms), then 'a', fingerprint, '' per URL; the reply: 1 per new URL.
PROBE_LUA = """--- @include "seen"
local d, err = seen_open('bench', KEYS[1], ARGV[1], KEYS, tonumber(ARGV[2]))
if err then return err end
local out = {}
for i = 3, #ARGV, 3 do out[#out + 1] = seen_add(d, ARGV[i + 1]) and 1 or 0 end
seen_close(d)
return out
"""
META = "{b}:bloom"
START_MS = 1_700_000_000_000


def fingerprint(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest()[:16]


class Calls:
    """The probe script on one filter: *spec* and *keys* say which."""

    def __init__(self, client: redis.Redis, dupefilter: AgedBloom | BloomFilter) -> None:
        text = scripts.read_lua("lib/prelude") + scripts._expand(PROBE_LUA, "bench", set())
        self.script = client.register_script(scripts.PLACEHOLDER.sub(scripts._constant, text))
        self.dupefilter, self.seq = dupefilter, 0

    def keys(self) -> list[str]:
        found = self.dupefilter
        if isinstance(found, AgedBloom):
            return [META]
        return [META] + [
            f"{META}:{layer}:{j}"
            for layer in range(found.passed() + 1)
            for j in range(len(found.sizes(layer)))
        ]

    def add(self, n: int, now: int) -> Any:
        urls: list[Any] = []
        for _ in range(n):
            urls += ["a", fingerprint(self.seq), ""]
            self.seq += 1
        for _ in range(3):  # the spec and the keys again once the layout is learnt
            try:
                args = [self.dupefilter.spec(), now, *urls]
                return self.script(keys=self.keys(), args=args)
            except redis.ResponseError as exc:
                if not self.dupefilter.adopt(exc):
                    raise
        raise RuntimeError("the filter's layout was not learnt")


def timed(client: redis.Redis, calls: Calls, args: argparse.Namespace, now: int) -> str:
    client.config_resetstat()
    took = []
    for _ in range(args.calls):
        start = time.perf_counter()
        calls.add(args.batch, now)
        took.append(time.perf_counter() - start)
    usec = client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"]
    return f"median {statistics.median(took) * 1000:.1f} ms, Redis {usec / 1000:.1f} ms a call"


def run(client: redis.Redis, args: argparse.Namespace) -> None:
    ttl_ms = 80_000
    sliced = Calls(client, AgedBloom.for_crawl(args.capacity, args.error, ttl_ms))
    now = START_MS
    for _ in range(SEEN_SLICES + 1):
        now += ttl_ms // SEEN_SLICES
        for _ in range(0, args.capacity // SEEN_SLICES, args.batch):
            sliced.add(args.batch, now)
    print(
        f"Bloom slices, 9 full slots, {args.batch} new URLs a call:",
        timed(client, sliced, args, now + 1),
    )
    client.flushdb()
    plain = Calls(client, BloomFilter(args.capacity, args.error))
    plain.seq = 10**9
    for _ in range(0, args.capacity, args.batch):
        plain.add(args.batch, now)
    print(
        f"Bloom kept for ever, first layer full, {args.batch} new URLs a call:",
        timed(client, plain, args, now),
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--capacity", type=int, default=80_000, help="URLs new within a TTL")
    parser.add_argument("--error", type=float, default=1e-6)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--calls", type=int, default=15)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = redis_servers.start(Path(tmp))
        try:
            run(server.client(), options)
        finally:
            server.kill()
