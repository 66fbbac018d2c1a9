"""Queue micro-benchmark: enqueue -> lease -> ack from one process, Redis round trips per
request, Redis memory per pending request, and worker memory against the queue's length.
Prints one JSON object. Run by ``bench/run.py``."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scrapy.settings import Settings

from scrapy_ha.keys import Keys
from scrapy_ha.store.connection import redis_from_settings
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry

ROOT = Path(__file__).resolve().parent.parent
BATCH = 500


def entries(start: int, n: int, site: str = "http://127.0.0.1:8000") -> list[NewEntry]:
    out = []
    for i in range(start, start + n):
        url = f"{site}/item/{i}"
        payload = json.dumps({"v": 1, "u": url, "cb": "parse_item"}, separators=(",", ":"))
        out.append(NewEntry(hashlib.sha1(url.encode()).digest()[:12], 0, payload.encode()))  # noqa: S324
    return out


async def throughput(q: RedisQueue, n: int) -> dict[str, Any]:
    """enqueue -> lease -> ack of *n* requests in batches; payloads are encoded beforehand
    (the codec's cost belongs to the crawl benchmark), so this times the queue itself."""
    await q.client.flushall()
    batches = [entries(start, min(BATCH, n - start)) for start in range(0, n, BATCH)]
    calls = 0
    started = time.perf_counter()
    for batch in batches:
        await q.sync(enqueue=batch)
        calls += 1
    acks: list[tuple[str, str]] = []
    done = 0
    while True:
        result = await q.sync(ack=acks, lease=BATCH)
        calls += 1
        done += result.acked
        acks = [(lease.id, lease.token) for lease in result.leases]
        if not acks:
            break
    seconds = time.perf_counter() - started
    assert done == n, (done, n)
    return {
        "requests": n,
        "seconds": round(seconds, 3),
        "per_second": round(n / seconds),
        "round_trips_per_request": round(calls / n, 4),
    }


async def memory(q: RedisQueue, n: int) -> dict[str, Any]:
    await q.client.flushall()
    before = (await q.client.info("memory"))["used_memory"]
    for start in range(0, n, 5000):
        await q.sync(enqueue=entries(start, min(5000, n - start)))
    after = (await q.client.info("memory"))["used_memory"]
    return {"pending": n, "bytes_per_request": round((after - before) / n, 1)}


async def prefill(q: RedisQueue, n: int, site: str) -> None:
    await q.client.flushall()
    for start in range(0, n, 5000):
        await q.sync(enqueue=entries(start + 1, min(5000, n - start), site))


def worker_memory(port: int, site: str, pages: int) -> int:
    """memusage/max (bytes) of a scrapy-ha crawl of *pages* pages from the prefilled queue."""
    with tempfile.TemporaryDirectory() as tmp:
        return _crawl_memory(Path(tmp) / "out.json", port, site, pages)


def _crawl_memory(out: Path, port: int, site: str, pages: int) -> int:
    args = [
        sys.executable,
        "-m",
        "scrapy.cmdline",
        "runspider",
        str(ROOT / "bench" / "spider.py"),
        "-a",
        f"base_url={site}",
        "-s",
        "SCHEDULER=scrapy_ha.Scheduler",
        "-s",
        f"REDIS_URL=redis://127.0.0.1:{port}/0",
        "-s",
        f"BENCH_OUT={out}",
        "-s",
        f"CLOSESPIDER_PAGECOUNT={pages}",
        "-s",
        "LOG_LEVEL=WARNING",
        "-s",
        "HA_DEDUPE_START_REQUESTS=True",
        "-s",
        "TELNETCONSOLE_ENABLED=False",
    ]
    subprocess.run(
        args,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return int(json.loads(out.read_text())["memusage"])


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-port", type=int, required=True)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--memory-sizes", default="100000,1000000")
    parser.add_argument("--site", required=True)
    args = parser.parse_args()
    # built as a worker builds its client (scrapy_ha.store.connection: hiredis packs)
    url = f"redis://127.0.0.1:{args.redis_port}/0"
    client = redis_from_settings(Settings({"REDIS_URL": url}), connect_timeout=5)
    q = RedisQueue(client, Keys("ha", "bench"))
    result: dict[str, Any] = {"throughput": await throughput(q, args.n)}
    sizes = [int(x) for x in args.memory_sizes.split(",")]
    result["redis_memory"] = [await memory(q, n) for n in sizes]
    result["worker_memory"] = []
    for n in (sizes[0], sizes[-1]):
        await prefill(q, n, args.site)
        rss = await asyncio.to_thread(worker_memory, args.redis_port, args.site, 2000)
        result["worker_memory"].append({"queued": n, "memusage_max_mb": round(rss / 2**20, 1)})
    await client.aclose()
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
