"""What a seen URL costs in Redis: the exact set and the Bloom filter (HA_DUPEFILTER), with
realistic URLs, through the scripts that enqueue; and the Bloom filter's measured
false-positive rate.

For each dupefilter and each size N, a fresh redis-server gets N URLs of the issue's form
(``https://www.example-shop-<n>.com/catalogue/category/books_<m>/item-<k>/index.html?ref=list``,
about 95 characters), their fingerprints the SHA-1 of the URL (Scrapy's is a SHA-1 of the
canonical request: the same size, as uniform), enqueued by ``sync.lua`` in calls of
``--batch``. The pending requests (their back queue) are deleted after each call, so that
what stays is what a crawl keeps once its requests are acked: the dupefilter (and a few
counters). Reported:
``used_memory`` after minus before, per URL, and the script's Redis CPU per URL (``INFO
commandstats``: what the enqueue costs Redis, the pending requests' own part included). The
Bloom filter and the exact set's buckets are sized to N (``HA_DUPEFILTER_CAPACITY = N``:
one layer, or N / 384 buckets rounded up to a power of two, as docs/reference.md says to
size them). The exact set is measured in both layouts: its buckets (a crawl made now) and
the single set of 12-byte fingerprints (a crawl made before them). ``--repeat`` runs every
dupefilter that many times, alternated (set, buckets, set, buckets...), so that their Redis
CPU is compared under the same load: take the medians.

The false-positive rate of a filter at capacity is measured on its bitmaps as stored: the
bitmaps are read (GET), and ``--probes`` random fingerprints never added are looked up with
the positions ``lua/lib/seen.lua`` uses (computed here the same way; a sample of the URLs
added is looked up first, and must all be found: the two agree). Then ``--fresh`` new URLs
are sent through the script itself, and those it filters are counted (its rate as the next
layer starts).

``--exact-alternatives`` also measures two layouts of the exact set that Redis stores
compactly (bucketed by the fingerprint's first bytes): sets of 64-bit integers (intsets,
``set-max-intset-entries`` 512) and hashes of 10-byte fields (listpacks,
``hash-max-listpack-entries`` 128), written with plain commands.

    python bench/seen.py --sizes 1000000 10000000 --probes 50000000
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
import redis.asyncio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scrapy_ha.keys import Keys  # noqa: E402
from scrapy_ha.store.bloom import BloomFilter, layer_sizes  # noqa: E402
from scrapy_ha.store.buckets import BucketSet, bucket_count  # noqa: E402
from scrapy_ha.store.queue import RedisQueue  # noqa: E402
from scrapy_ha.store.wire import NewEntry  # noqa: E402
from tests import redis_servers  # noqa: E402

KEYS = Keys("ha", "seen")
#: False positives the probe looks for (±5 %), when --probes allows it.
PROBE_HITS = 400
#: The dupefilters measured: (name, HA_DUPEFILTER_ERROR_RATE, or None for the exact set in
#: buckets, 0 for the single set of a crawl made before them).
FILTERS = (("set", 0), ("buckets", None), ("bloom 1e-3", 1e-3), ("bloom 1e-6", 1e-6))


def url(i: int) -> bytes:
    shop, book, item = i % 997, (i // 997) % 50, i
    return (
        b"https://www.example-shop-%d.com/catalogue/category/books_%d/item-%d/index.html"
        b"?ref=list" % (shop, book, item)
    )


def fingerprint(i: int, salt: bytes = b"") -> bytes:
    return hashlib.sha1(salt + url(i)).digest()


def used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


async def fill(
    port: int, error: float | None, n: int, batch: int, salt: bytes = b""
) -> tuple[int, int]:
    """Send URLs 0..n-1 through sync.lua; return how many it added, and used_memory once the
    script was loaded (by a call that enqueues nothing), before the first URL."""
    client = redis.asyncio.Redis(port=port)
    queue = RedisQueue(client, KEYS)
    if error is None:
        queue.dupefilter = BucketSet(bucket_count(n))
    elif error:
        queue.dupefilter = BloomFilter(n, error)
    size = queue.dupefilter.fingerprint_bytes
    pending = [KEYS.ready, KEYS.queued, KEYS.payload, KEYS.queue("0:-")]
    # Redis's slow log keeps the last 128 calls slower than 10 ms (those of a busy
    # machine) with their arguments: half a megabyte that is no URL's
    await client.config_set("slowlog-log-slower-than", -1)
    await client.slowlog_reset()
    await queue.sync()
    before = int((await client.info("memory"))["used_memory"])
    await client.config_resetstat()
    added = 0
    for start in range(0, n, batch):
        stop = min(n, start + batch)
        entries = [NewEntry(fingerprint(i, salt)[:size], 0, b"") for i in range(start, stop)]
        added += await queue.enqueue(entries)
        await client.delete(*pending)
    await client.aclose()
    return added, before


# -- the bitmaps, looked up as seen.lua does -----------------------------------------------


def positions(h1: int, h2: int, m: int, k: int) -> list[int]:
    x, y, out = h1 % m, h2 % m, []
    for i in range(1, k + 1):
        out.append(x)
        x = (x + y) % m
        y = (y + i) % m
    return out


def hashes(fp: bytes) -> tuple[int, int]:
    return int.from_bytes(fp[4:10], "big"), int.from_bytes(fp[10:16], "big")


def has(bits: bytes, h1: int, h2: int, k: int) -> bool:
    m = len(bits) * 8
    x, y = h1 % m, h2 % m
    for i in range(1, k + 1):
        if not bits[x >> 3] & (0x80 >> (x & 7)):
            return False
        x = (x + y) % m
        y = (y + i) % m
    return True


def layer_bits(client: redis.Redis, n: int, k: int) -> bytes:
    """Layer 0's parts, read and joined (each part's bits follow the last's)."""
    sizes = layer_sizes(n, k, BloomFilter(n, 0.5).part, 0)
    return b"".join(client.get(KEYS.bloom_part(0, j)) or b"" for j in range(len(sizes)))


def probe(client: redis.Redis, n: int, k: int, probes: int, sample: int) -> dict[str, Any]:
    """Look up a sample of the URLs added (all must be found) and random fingerprints
    never added: enough for about PROBE_HITS false positives, at most *probes*."""
    probes = min(probes, int(PROBE_HITS * 2**k))
    bits = layer_bits(client, n, k)
    step = max(1, n // sample)
    missing = sum(not has(bits, *hashes(fingerprint(i)), k) for i in range(0, n, step))
    rng = random.Random(31)
    hits = sum(has(bits, rng.getrandbits(48), rng.getrandbits(48), k) for _ in range(probes))
    return {
        "sample_added": len(range(0, n, step)),
        "sample_missing": missing,
        "probes": probes,
        "false_positives": hits,
        "rate": hits / probes,
        "layer_rate_at_capacity": 2.0**-k,
    }


# -- the exact set, bucketed ---------------------------------------------------------------


def bucketed(port: int, n: int, layout: str, batch: int) -> int:
    """used_memory after n fingerprints in buckets of about 400 (intsets: 8-byte members
    and a bucket from 2-3 bytes) or 100 (listpacks: 10-byte fields)."""
    client = redis.Redis(port=port)
    per = 400 if layout == "intset" else 100
    buckets = max(1, n // per)
    before = used(client)
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        fp = fingerprint(i)
        bucket = int.from_bytes(fp[:4], "big") % buckets
        if layout == "intset":
            pipe.sadd(f"b:{bucket}", int.from_bytes(fp[4:12], "big", signed=True))
        else:
            pipe.hset(f"b:{bucket}", fp[2:12], b"")
        if len(pipe) >= batch:
            pipe.execute()
    pipe.execute()
    encoding = client.object("encoding", "b:0").decode()
    after = used(client)
    client.close()
    return after - before, encoding


def measure(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    rows = []
    for n in args.sizes:
        for run, (name, error) in enumerate(FILTERS * args.repeat):
            if args.filters and name not in args.filters:
                continue
            server = redis_servers.start(tmp / f"{name}-{n}-{run}".replace(" ", "-"))
            try:
                client = server.client()
                started = time.monotonic()
                added, before = asyncio.run(fill(server.port, error, n, args.batch))
                seconds = time.monotonic() - started
                after = used(client)
                stats = client.info("commandstats")  # the sync script: FCALL on Redis 7+
                script = stats.get("cmdstat_fcall") or stats.get("cmdstat_evalsha", {})
                row: dict[str, Any] = {
                    "dupefilter": name,
                    "urls": n,
                    "added": added,
                    "bytes_per_url": round((after - before) / n, 2),
                    "seconds": round(seconds, 1),
                    "redis_us_per_url": round(script.get("usec", 0) / n, 2),
                }
                if error is None:
                    buckets = bucket_count(n)
                    first = next(client.scan_iter(match=f"{KEYS.buckets}:*", count=1000))
                    row |= {
                        "buckets": buckets,
                        "encoding": client.object("encoding", first).decode(),
                    }
                if error:
                    k = BloomFilter(n, error).k
                    row["probe"] = probe(client, n, k, args.probes, args.sample)
                    fresh, _ = asyncio.run(
                        fill(server.port, error, args.fresh, args.batch, b"new ")
                    )
                    row["fresh"] = {"sent": args.fresh, "filtered": args.fresh - fresh}
                rows.append(row)
                print(json.dumps(row), flush=True)
                client.close()
            finally:
                server.kill()
        if args.exact_alternatives:
            for layout in ("intset", "listpack"):
                server = redis_servers.start(tmp / f"{layout}-{n}")
                try:
                    delta, encoding = bucketed(server.port, n, layout, args.batch)
                    row = {"dupefilter": f"set, bucketed ({layout})", "urls": n}
                    row |= {"bytes_per_url": round(delta / n, 2), "encoding": encoding}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                finally:
                    server.kill()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--batch", type=int, default=500, help="URLs per script call")
    parser.add_argument("--probes", type=int, default=2_000_000)
    parser.add_argument("--sample", type=int, default=100_000, help="added URLs looked up")
    parser.add_argument("--fresh", type=int, default=200_000)
    parser.add_argument("--exact-alternatives", action="store_true")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each, alternated")
    parser.add_argument("--filters", nargs="*", help="of: " + ", ".join(n for n, _ in FILTERS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(args, Path(tmp))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
