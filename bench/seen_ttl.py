"""What a seen URL costs in Redis with ``HA_DUPEFILTER_TTL``: the dupefilter's time slices
(lua/lib/aged.lua) in steady state, through the scripts that enqueue, and the error a check
of a Bloom filter's slices runs at, measured against the one the crawl reports.

For each dupefilter a fresh redis-server gets URLs of bench/seen.py's form at a steady rate,
N / 9 per slot (a TTL / 8), for 9 slots: at the end the ring holds 9 slots and about N URLs,
as a crawl that sees N / 8 new URLs per TTL / 8 does once it ran a TTL (its
``HA_DUPEFILTER_CAPACITY`` is N * 8 / 9, the URLs new within a TTL). The pending requests
are deleted after each call (what stays is the dupefilter). Reported: ``used_memory`` after
minus before, per URL held (and for a Bloom filter its bitmaps' ``MEMORY USAGE`` per URL
held, without the fixed overhead of a small run); for a Bloom filter, the error
``scrapy-ha status`` reports (``error_now``: the sum of the live slots') and the one
measured: ``--probes`` fingerprints never added looked up by ``lua/seen_check.lua`` in
every slot within the TTL.

    python bench/seen_ttl.py --urls 1000000 --ttl 72 --filters "set" "bloom 1e-6" "bloom 1e-3"
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import tempfile
import time
from pathlib import Path

import redis.asyncio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.seen import KEYS, fingerprint  # noqa: E402
from scrapy_ha.keys import SEEN_SLICES  # noqa: E402
from scrapy_ha.store.aged import AgedBloom, AgedSet, slices_where  # noqa: E402
from scrapy_ha.store.bloom import filter_keys  # noqa: E402
from scrapy_ha.store.bloom_state import bloom_state  # noqa: E402
from scrapy_ha.store.queue import RedisQueue  # noqa: E402
from scrapy_ha.store.wire import NewEntry  # noqa: E402
from tests import redis_servers  # noqa: E402

SLOTS = SEEN_SLICES + 1


async def measure(port: int, kind: str, n: int, ttl: float, batch: int, probes: int) -> dict:
    client = redis.asyncio.Redis(port=port)
    queue = RedisQueue(client, KEYS)
    ttl_ms = int(ttl * 1000)
    if kind == "set":
        queue.dupefilter = AgedSet(ttl_ms)
    else:
        capacity = math.ceil(n * SEEN_SLICES / SLOTS)  # the URLs new within a TTL
        queue.dupefilter = AgedBloom.for_crawl(capacity, float(kind.split()[1]), ttl_ms)
    size = queue.dupefilter.fingerprint_bytes
    pending = [KEYS.ready, KEYS.queued, KEYS.payload, KEYS.queue("0:-")]
    await client.config_set("slowlog-log-slower-than", -1)
    await queue.sync()
    before = int((await client.info("memory"))["used_memory"])
    period, per_slot, added, i = ttl / SEEN_SLICES, -(-n // SLOTS), 0, 0
    start = time.monotonic()
    for slot in range(SLOTS):
        filled = time.monotonic()
        for _ in range(0, per_slot, batch):
            entries = [NewEntry(fingerprint(j)[:size], 0, b"") for j in range(i, i + batch)]
            i += batch
            added += await queue.enqueue(entries)
            await client.delete(*pending)
        if time.monotonic() - filled > period:
            raise SystemExit(f"filling a slot took longer than a slot ({period} s): raise --ttl")
        if slot < SLOTS - 1:  # until the slot's end by the server's clock (its first call)
            await asyncio.sleep(
                (await _newest(client) + period * 1000 + 5 - await _now(client)) / 1000
            )
    used = int((await client.info("memory"))["used_memory"]) - before
    held = (await queue.counts()).fingerprints
    row = {"kind": kind, "added": added, "held": held, "bytes_per_url": used / held}
    if kind != "set":
        state = bloom_state(await client.hgetall(KEYS.bloom))
        assert state is not None
        bitmaps = await filter_keys(client, KEYS)
        sizes = [await client.memory_usage(key) or 0 for key in bitmaps]
        row["bitmap_bytes_per_url"] = sum(sizes) / held  # without Redis's fixed overhead
        found = 0
        for p in range(0, probes, 2000):
            fps = [fingerprint(j, b"never")[:size] for j in range(p, min(probes, p + 2000))]
            found += sum(1 for s in await slices_where(client, KEYS, fps) if s)
        row.update(
            slices=state.slices,
            k=state.k,
            error_reported=state.error_now,
            error_measured=found / probes,
            false_positives=found,
            error_asked=state.asked,
            elapsed=time.monotonic() - start,
        )
    await client.aclose()
    return row


async def _newest(client: redis.asyncio.Redis) -> int:
    """The start (server ms) of the newest slot of the ring."""
    meta = await client.hgetall(KEYS.bloom) or await client.hgetall(KEYS.aged)
    return max(int(v) for k, v in meta.items() if k.startswith(b"s"))


async def _now(client: redis.asyncio.Redis) -> int:
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for run, kind in enumerate(args.filters):
            server = redis_servers.start(Path(tmp) / f"{run}")
            try:
                row = await measure(server.port, kind, args.urls, args.ttl, args.batch, args.probes)
            finally:
                server.kill()
            print(row, flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--urls", type=int, default=1_000_000, help="URLs the ring holds")
    parser.add_argument("--ttl", type=float, default=72.0, help="seconds (slots of ttl/8)")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--probes", type=int, default=1_000_000)
    parser.add_argument("--filters", nargs="+", default=["set", "bloom 1e-6", "bloom 1e-3"])
    asyncio.run(main(parser.parse_args()))
