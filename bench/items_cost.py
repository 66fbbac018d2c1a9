"""What the item outbox costs Redis: memory per item in the stream, and round trips per page.

``python bench/items_cost.py`` starts its own redis-server, enqueues and leases pages, and
acks them through the sync script with their items (``HA_ITEMS = "outbox"``'s real path:
20 items per page, in batches of 100 acks per call, as a worker's rounds send them), for two
shapes of item: the benchmark spider's ``{"id": "123"}`` and a product of ~200 bytes as the
codec stores it (a Decimal, a datetime, a list). It prints the stream's ``MEMORY USAGE``
(all entries sampled) and the growth of ``used_memory`` per item, next to the item's stored
size, and the script calls per page with and without items (the items ride in the ack's
argument: no call is added).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import sys
import tempfile
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis.asyncio  # noqa: E402

from scrapy_ha.codec.items import encode_item  # noqa: E402
from scrapy_ha.demo import harness  # noqa: E402
from scrapy_ha.keys import Keys  # noqa: E402
from scrapy_ha.store.queue import RedisQueue  # noqa: E402
from scrapy_ha.store.wire import Commit, NewEntry  # noqa: E402

#: Items per page and acks per sync call: a list page of the catalogue, a worker's round.
PER_PAGE, ACKS_PER_CALL = 20, 100


def small(n: int) -> Any:
    return {"id": str(n)}


def product(n: int) -> Any:
    return {
        "id": n,
        "title": f"A Light in the Attic, volume {n}",
        "url": f"https://books.example.com/catalogue/a-light-in-the-attic_{n}/index.html",
        "price": Decimal("51.77"),
        "currency": "GBP",
        "in_stock": n % 3 != 0,
        "rating": 3,
        "tags": ["poetry", "classics"],
        "scraped_at": datetime.datetime(2026, 12, 1, 12, 0, n % 60, tzinfo=datetime.UTC),
    }


async def measure(port: int, shape: str, pages: int, with_items: bool) -> dict[str, Any]:
    client = redis.asyncio.Redis(port=port)
    await client.flushall()
    await client.config_resetstat()
    queue = RedisQueue(client, Keys("ha", f"bench-{shape}"))
    make = small if shape == "small" else product
    for first in range(0, pages, 500):
        batch = range(first, min(pages, first + 500))
        await queue.enqueue([NewEntry(b"", 0, b'{"v":1,"u":"https://x/%d"}' % i) for i in batch])
    before = int((await client.info("memory"))["used_memory"])
    sizes, item_no = [], 0
    calls = 0
    while True:
        leases = await queue.lease(ACKS_PER_CALL, 600_000)
        if not leases:
            break
        commits = {}
        for lease in leases:
            items = tuple(encode_item(make(item_no + i), None) for i in range(PER_PAGE))
            item_no += PER_PAGE
            sizes += [len(x) for x in items]
            if with_items:
                commits[lease.id, lease.token] = Commit(items)
        await queue.sync(ack=[(x.id, x.token) for x in leases], commits=commits)
        calls += 1
    stream = queue.keys.items
    usage = await client.memory_usage(stream, samples=0) if with_items else 0
    after = int((await client.info("memory"))["used_memory"])
    scripts = sum(
        int(v["calls"])
        for k, v in (await client.info("commandstats")).items()
        if k in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall")
    )
    n = await client.xlen(stream)
    await client.aclose()
    return {
        "shape": shape,
        "items": n,
        "stored_bytes_per_item": sum(sizes) / len(sizes),
        "stream_bytes_per_item": usage / n if n else 0.0,
        "used_memory_per_item": (after - before) / n if n else 0.0,
        "scripts_per_page": scripts / pages,
    }


async def main(port: int, pages: int) -> list[dict[str, Any]]:
    results = []
    for shape in ("small", "product"):
        for with_items in (False, True):
            result = await measure(port, shape, pages, with_items)
            results.append({**result, "with_items": with_items})
            print(json.dumps(results[-1]), flush=True)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=5000, help="pages of 20 items")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = harness.start_redis(Path(tmp))
        try:
            asyncio.run(main(port, args.pages))
        finally:
            harness.stop(proc)
