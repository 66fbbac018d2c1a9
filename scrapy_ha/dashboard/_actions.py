"""What the dashboard's buttons do: the same functions the ``scrapy-ha`` commands call.

Each action names the table it acts on (``dead``, ``delayed`` or none for a whole crawl),
the word that reports it ("requeued 3 of 3 entries") and the function that does it.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from scrapy_ha._queue import RedisQueue
from scrapy_ha.dlq import DeadLetterQueue

#: Entries changed per Redis call by a bulk action (as the CLI's batches).
BATCH = 500

#: An action's work: the crawl's queue and the selected entry ids -> how many it touched.
Run = Callable[[RedisQueue, list[str]], Awaitable[int]]


@dataclass(frozen=True)
class Action:
    name: str
    #: What the report says it did ("requeued").
    done: str
    #: The table whose entries it takes (None: it acts on the crawl itself).
    table: str | None
    run: Run
    #: A sentence for the confirmation page.
    explain: str


async def _server_ms(queue: RedisQueue) -> int:
    seconds, micros = await queue.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def make_due(queue: RedisQueue, ids: list[str]) -> int:
    """``scrapy-ha delayed retry-now``: these delayed retries are due now (Redis time); the
    next sync of any worker promotes them. Returns how many were still delayed."""
    now = await _server_ms(queue)
    changed = 0
    for start in range(0, len(ids), BATCH):
        mapping = dict.fromkeys(ids[start : start + BATCH], now)
        changed += int(await queue.client.zadd(queue.keys.delayed, mapping, xx=True, ch=True))
    return changed


async def pause(queue: RedisQueue, ids: list[str]) -> int:
    """``scrapy-ha pause``: set the crawl's paused key (when and by whom); workers lease
    nothing new at their next sync. 1 if it was not paused yet, else 0."""
    who = f"dashboard@{socket.gethostname()}"
    doc = json.dumps({"at": await _server_ms(queue), "by": who})
    return 1 if await queue.client.set(queue.keys.paused, doc, nx=True) else 0


async def resume(queue: RedisQueue, ids: list[str]) -> int:
    """``scrapy-ha resume``: delete the paused key. 1 if it was paused, else 0."""
    return int(await queue.client.delete(queue.keys.paused))


async def _requeue(queue: RedisQueue, ids: list[str]) -> int:
    return await DeadLetterQueue(queue).requeue(ids)


async def _purge(queue: RedisQueue, ids: list[str]) -> int:
    return await DeadLetterQueue(queue).purge(ids)


ACTIONS: dict[str, Action] = {
    a.name: a
    for a in (
        Action(
            "requeue",
            "requeued",
            "dead",
            _requeue,
            "Put these dead letters back in the pending queue with their attempts reset.",
        ),
        Action(
            "purge",
            "purged",
            "dead",
            _purge,
            "Delete these dead letters for good (they cannot be requeued afterwards).",
        ),
        Action(
            "retry-now",
            "made due now",
            "delayed",
            make_due,
            "Make these delayed retries due now: the next sync of any worker takes them.",
        ),
        Action(
            "pause",
            "paused",
            None,
            pause,
            "Workers lease nothing new: they finish what they hold, keep their leases "
            "renewed and stay open until the crawl is resumed.",
        ),
        Action("resume", "resumed", None, resume, "Workers lease again at their next sync."),
    )
}
