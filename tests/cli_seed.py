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

from scrapy_ha._queue import NewEntry, RedisQueue
from scrapy_ha.codec import describe, encode_request
from scrapy_ha.keys import Keys

ROOT = Path(__file__).resolve().parent.parent
SCRAPY_HA = str(Path(sys.executable).parent / "scrapy-ha")


def scrapy_ha(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """The console script as a user runs it; stdin is not a terminal (``/dev/null``)."""
    kwargs.setdefault("cwd", ROOT)
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run([SCRAPY_HA, *args], capture_output=True, text=True, timeout=120, **kwargs)


async def _leased(queue: RedisQueue, urls: list[str]) -> list[Any]:
    entries = [NewEntry(b"", 0, encode_request(Request(url), None)) for url in urls]
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


async def _delayed(url: str, spider: str, rows: list[tuple[str, int]]) -> list[str]:
    client = redis.asyncio.Redis.from_url(url)
    queue = RedisQueue(client, Keys("ha", spider))
    leases = await _leased(queue, [u for u, _ in rows])
    delays = dict(rows)
    for lease in leases:
        await queue.retry_later(
            lease.id, lease.token, delays[_url_of(lease.payload)], lease.payload
        )
    await client.aclose()
    return [lease.id for lease in leases]


def delayed(url: str, spider: str, rows: list[tuple[str, int]]) -> list[str]:
    """Put one request per (url, delay ms) in the delayed set, as a retry does."""
    return _run(_delayed(url, spider, rows))
