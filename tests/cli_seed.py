"""Queue states for the CLI's tests, made through the queue's own scripts (enqueue, lease,
dead-letter, retry later), so the CLI reads what workers write, without a crawl's minutes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import redis.asyncio
from scrapy import Request

from scrapy_ha import metakeys
from scrapy_ha.codec import describe, encode_request
from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry

ROOT = Path(__file__).resolve().parent.parent
SCRAPY_HA = str(Path(sys.executable).parent / "scrapy-ha")


def scrapy_ha(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """The console script as a user runs it; stdin is not a terminal (``/dev/null``)."""
    kwargs.setdefault("cwd", ROOT)
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run([SCRAPY_HA, *args], capture_output=True, text=True, timeout=120, **kwargs)


async def _leased(
    queue: RedisQueue, urls: list[str], metas: list[dict[str, Any]] | None = None
) -> list[Any]:
    metas = metas or [{} for _ in urls]
    entries = [
        NewEntry(b"", 0, encode_request(Request(url, meta=meta), None))
        for url, meta in zip(urls, metas, strict=True)
    ]
    for i in range(0, len(entries), 500):
        await queue.enqueue(entries[i : i + 500])
    return await queue.lease(len(urls), 600_000)


async def _dead(url: str, spider: str, rows: list[tuple[str, str, int | None]]) -> None:
    client = redis.asyncio.Redis.from_url(url)
    queue = RedisQueue(client, Keys("ha", spider))
    leases = await _leased(queue, [u for u, _, _ in rows])
    by_url = {u: (c, s) for u, c, s in rows}
    for lease in leases:
        fclass, status = by_url[_url_of(lease.payload)]
        info = {"class": fclass, "reason": f"HTTP {status}", "status": status, "attempts": 1}
        await queue.dead_letter(lease.id, lease.token, info)
    await client.aclose()


def _url_of(payload: bytes) -> str:
    return describe(payload).url or ""


def _run(coro: Any) -> Any:
    """Run *coro* on an event loop of its own (pytest-twisted's loop may be running here)."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(asyncio.run(coro)))
    thread.start()
    thread.join()
    return result[0]


def dead_letters(url: str, spider: str, rows: list[tuple[str, str, int | None]]) -> None:
    """Dead-letter one request per (url, class, status), through lease and dead.lua."""
    _run(_dead(url, spider, rows))


async def _delayed(url: str, spider: str, rows: list[tuple[str, int, str]]) -> list[str]:
    client = redis.asyncio.Redis.from_url(url)
    queue = RedisQueue(client, Keys("ha", spider))
    metas = [
        {
            metakeys.RETRIES: {fclass: 2},
            metakeys.HISTORY: [{"t": 0, "class": fclass, "outcome": "HTTP 503"}] * 2,
        }
        for _, _, fclass in rows
    ]
    leases = await _leased(queue, [u for u, _, _ in rows], metas)
    by_url = {u: (d, c) for u, d, c in rows}
    for lease in leases:
        delay, fclass = by_url[_url_of(lease.payload)]
        await queue.retry_later(lease.id, lease.token, delay, lease.payload, failure_class=fclass)
    await client.aclose()
    return [lease.id for lease in leases]


def delayed(url: str, spider: str, rows: list[tuple[str, int, str]]) -> list[str]:
    """Put one request per (url, delay ms, failure class) in the delayed set, as the retry
    of its third attempt does."""
    return _run(_delayed(url, spider, rows))


async def _lease_all(url: str, spider: str) -> list[str]:
    client = redis.asyncio.Redis.from_url(url)
    leases = await RedisQueue(client, Keys("ha", spider)).lease(1000, 600_000)
    await client.aclose()
    return [_url_of(lease.payload) for lease in leases]


def lease_all(url: str, spider: str) -> list[str]:
    """What a worker's sync leases now (due delayed entries are promoted first): URLs."""
    return _run(_lease_all(url, spider))


async def _sync(url: str, spider: str, lease: int) -> Any:
    client = redis.asyncio.Redis.from_url(url)
    result = await RedisQueue(client, Keys("ha", spider)).sync(lease=lease, lease_ms=600_000)
    await client.aclose()
    return result


def sync(url: str, spider: str, lease: int) -> Any:
    """One worker sync that leases up to *lease* entries: its ``SyncResult``."""
    return _run(_sync(url, spider, lease))


async def _renew(url: str, spider: str, worker: str, pairs: list[Any], rate: float | None) -> None:
    client = redis.asyncio.Redis.from_url(url)
    queue = RedisQueue(client, Keys("ha", spider))
    await queue.renew(pairs, worker=worker, lease_ms=600_000, heartbeat_ms=600_000, rate=rate)
    await client.aclose()


def renew(url: str, spider: str, worker: str, pairs: list[Any], rate: float | None) -> None:
    """A worker's lease renewal (heartbeat and stats) as its keeper makes it."""
    _run(_renew(url, spider, worker, pairs, rate))
