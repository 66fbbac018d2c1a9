"""What the dashboard's buttons do: the same functions the ``scrapy-ha`` commands call, on
every shard of a sharded crawl (ids as workers show them: ``<shard>:<id>`` beyond shard 0).

Each action names the table it acts on (``dead``, ``delayed`` or none for a whole crawl),
the word that reports it ("requeued 3 of 3 entries") and the function that does it.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from scrapy_ha.ops import operations
from scrapy_ha.ops.gates import domain_of, open_gates
from scrapy_ha.ops.shards import dead_letters
from scrapy_ha.store.queue import RedisQueue


@dataclass(frozen=True)
class Done:
    """What an action did: how many entries it touched, and why it left the others (a
    clause of its report, or "")."""

    touched: int
    untouched: str = ""


#: An action's work: the crawl's queue and the selected entry ids -> what it did.
Run = Callable[[RedisQueue, list[str]], Awaitable[Done]]


@dataclass(frozen=True)
class Action:
    name: str
    #: What the report says it did ("requeued").
    done: str
    #: The table whose entries it takes (None: it acts on the crawl itself; ``gates``: the
    #: crawl page's closed gates, by domain).
    table: str | None
    run: Run
    #: A sentence for the confirmation page.
    explain: str


async def _make_due(queue: RedisQueue, ids: list[str]) -> Done:
    touched = await operations.make_due(queue, ids)
    gone = len(set(ids)) - touched
    if gone <= 0:
        return Done(touched)
    them = "it" if gone == 1 else "them"
    return Done(
        touched,
        f"{_were(gone)} not delayed any more (a worker took {them} already, or no such entry)",
    )


async def _open_gates(queue: RedisQueue, ids: list[str]) -> Done:
    domains = list(dict.fromkeys(domain_of(i) for i in ids))
    touched = len((await open_gates(queue, domains)).gates)
    gone = len(domains) - touched
    return Done(touched, f"{_were(gone)} open already" if gone else "")


async def _pause(queue: RedisQueue, ids: list[str]) -> Done:
    return Done(int(await operations.pause(queue, by=f"dashboard@{socket.gethostname()}")))


async def _resume(queue: RedisQueue, ids: list[str]) -> Done:
    return Done(int(await operations.resume(queue)))


async def _requeue(queue: RedisQueue, ids: list[str]) -> Done:
    dlq = dead_letters(queue)
    touched = await dlq.requeue(ids)
    stuck, one = dlq.without_request, len(dlq.without_request) == 1
    kept = (
        f"{len(stuck)} kept: "
        + ("its stored request is" if one else "their stored requests are")
        + f" gone ({' '.join(stuck[:_NAMED])}{' ...' if len(stuck) > _NAMED else ''}), so "
        + ("it cannot be requeued: purge it" if one else "they cannot be requeued: purge them")
    )
    return Done(touched, _untouched(ids, touched, len(stuck), kept))


async def _purge(queue: RedisQueue, ids: list[str]) -> Done:
    dlq = dead_letters(queue)
    touched = await dlq.purge(ids)
    spider = queue.keys.spider
    kept = (
        f"{dlq.kept_unarchived} kept: not archived yet (an SQL archive is declared for "
        f"{spider}): run `scrapy-ha dlq archive {spider}` first, then purge again"
    )
    return Done(touched, _untouched(ids, touched, dlq.kept_unarchived, kept))


def _were(n: int) -> str:
    """``1 was``, ``3 were``: how many entries an action left, in its report."""
    return f"{n} {'was' if n == 1 else 'were'}"


#: The ids a report names of the entries a requeue kept (a screenful, not thousands).
_NAMED = 10


def _untouched(ids: list[str], touched: int, kept: int, why_kept: str) -> str:
    """Why a dead-letter action left entries it was given: *kept* of them for *why_kept*,
    the others no longer dead letters (requeued or purged meanwhile by someone else, from
    another page or ``scrapy-ha dlq``, or by this form sent twice; or no such entry)."""
    gone = len(set(ids)) - touched - kept
    said = [why_kept] if kept else []
    if gone > 0:
        said.insert(
            0,
            f"{_were(gone)} not in the dead-letter queue "
            "(requeued or purged already, or no such entry)",
        )
    return "; ".join(said)


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
            _make_due,
            "Make these delayed retries due now: the next sync of any worker takes them.",
        ),
        Action(
            "open-gate",
            "opened",
            "gates",
            _open_gates,
            "Open these domains' gates now (a 429 closed them for every worker): each worker "
            "opens its copy at its next sync, and what waited behind them goes at once. A site "
            "still rate-limiting closes its gate again with its next 429.",
        ),
        Action(
            "pause",
            "paused",
            None,
            _pause,
            "Workers lease nothing new: they finish what they hold, keep their leases "
            "renewed and stay open until the crawl is resumed.",
        ),
        Action("resume", "resumed", None, _resume, "Workers lease again at their next sync."),
    )
}
