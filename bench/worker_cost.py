"""The worker's CPU per request, part by part, without a crawl's noise.

Whole-crawl series (``bench/static_bench.py``) vary by ±10% between runs on a shared
machine: more than scrapy-ha's whole cost. This times the two parts of that cost on their
own, in CPU time of this process (``time.process_time``), medians of ``--repeats``:

- ``shell``: what the engine calls per request, answered from memory: ``enqueue_request``,
  ``next_request`` (the request handed out before Redis has it), and the round's
  bookkeeping in the worker (seal, settle, collect the finished request), against Scrapy's
  own scheduler (``enqueue_request`` and ``next_request``, memory queues) on the same
  requests; and of that, the garbage collector's part and how often it ran
  (``gc.callbacks``). No Redis: the session is the shell tests' stand-in
  (``tests/test_scheduler_shell.py``).
- ``round``: one ``sync.lua`` call (enqueue *k* new requests, ack *k*, lease *k*) against a
  local redis-server, for *k* = 1, 10 and 30; fixed cost per round and cost per request
  (a least-squares line), with the reply parser redis-py uses (hiredis if installed).

With ``--shape crawl`` the requests are shaped as a spider's links are: a Referer header and
``depth`` in meta (what Scrapy's RefererMiddleware and DepthMiddleware add), and the shell
has a dictionary trained from the first of them, as a crawl does once it has one (it
compacts the new requests it does not hand out; this benchmark's are all handed out, as a
static crawl's are, and stored as documents). ``--shape addon`` adds what the add-on's
ParentLeaseMiddleware writes: each request names the page that yielded it
(``meta["_ha_parent"]``, its lease), a page the shell holds until its round, then finishes
(acked), as a worker does. The default, ``bare``, is ``Request(url)``.

``python bench/worker_cost.py`` prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import queue_micro  # noqa: E402
from scrapy import Request, Spider  # noqa: E402
from scrapy.core.scheduler import Scheduler as ScrapyScheduler  # noqa: E402
from scrapy.settings import Settings  # noqa: E402
from scrapy.utils.test import get_crawler  # noqa: E402

from scrapy_ha import metakeys  # noqa: E402
from scrapy_ha.codec.compact import Dictionary, train  # noqa: E402
from scrapy_ha.codec.encode import encode_request  # noqa: E402
from scrapy_ha.demo import harness  # noqa: E402
from scrapy_ha.keys import Keys  # noqa: E402
from scrapy_ha.store.connection import redis_from_settings  # noqa: E402
from scrapy_ha.store.dictionary import DICTIONARY_ID, SAMPLES  # noqa: E402
from scrapy_ha.store.queue import RedisQueue  # noqa: E402
from tests.test_keep import send  # noqa: E402
from tests.test_scheduler_shell import FakeEngine, shell  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Callable

#: Requests per simulated list page: what one response yields before the engine takes them.
PER_PAGE = 20
#: Requests per round of the round benchmark.
ROUND_SIZES = (1, 10, 30)
#: Requests put through a part before it is measured (first calls, caches, lazy imports).
WARM_UP = 400
#: Microseconds in a second.
US = 1e6
#: Requests a second of the worker whose pace the shell's clock keeps (the pruning of the
#: children it keeps for a failover, every second, of those older than 10 s): a crawl at
#: 500 pages/s (scrapy_ha.scheduler.outbox.Retained). On the real clock the pruning ran once
#: per second of however long the run took, so more often per request under callgrind's
#: slowdown or a loaded machine, and the instruction count moved with the machine's load.
WORKER_RATE = 500.0


#: Numbers the URLs: every request a part sees is new (never a duplicate).
_URL_NUMBERS = itertools.count()
#: The requests' shape (``--shape``): ``bare``, ``crawl`` or ``addon``.
SHAPES = ("bare", "crawl", "addon")
_SHAPE = ["bare"]
#: The page a crawl-shaped request was linked from.
REFERER = "http://127.0.0.1:8000/list/3.html"


def _request(url: str, parent: tuple[str, str] | None = None) -> Request:
    """A request of the chosen shape (see the module docstring), yielded by the page
    holding the lease *parent* (``addon``)."""
    if _SHAPE[0] == "bare":
        return Request(url)
    meta: dict[str, Any] = {"depth": 1}
    if _SHAPE[0] == "addon":
        meta[metakeys.PARENT] = parent or ("0", "page")
    return Request(url, headers={"Referer": REFERER}, meta=meta)


def _compacting(s: Any) -> None:
    """With ``--shape crawl`` or ``addon``: the shell compacts with a dictionary of such
    requests."""
    if _SHAPE[0] != "bare":
        samples = [encode_request(_request(url), s.spider) for url in _urls(SAMPLES)]
        s.admission.compactor.adopt(Dictionary(DICTIONARY_ID, train(samples)))


def _urls(n: int) -> list[str]:
    return [f"http://127.0.0.1:8000/item/{next(_URL_NUMBERS)}" for _ in range(n)]


def shell_run() -> Callable[[int], None]:
    """scrapy-ha's shell, built: a function that puts *n* requests through it (enqueue,
    hand out, the round's bookkeeping, finished)."""
    s, _, engine = shell()
    s._slots.free = lambda crawler, request: True  # noqa: ARG005 (a free download slot)
    active = engine.downloader.active
    clock = [0.0]  # seconds, at the worker's pace (WORKER_RATE)
    s.outbox.retained.clock = lambda: clock[0]
    _compacting(s)

    def run(n: int) -> None:
        urls = _urls(n)
        for i in range(0, n, PER_PAGE):
            clock[0] += PER_PAGE / WORKER_RATE
            parent = None
            if _SHAPE[0] == "addon":  # the page that yields them, held until its round
                parent = (f"p{next(_URL_NUMBERS)}", "page")
                s.inflight.add(*parent, Request(REFERER), stored=False)
            for url in urls[i : i + PER_PAGE]:
                s.enqueue_request(_request(url, parent))
            while (request := s.next_request()) is not None:
                active.add(request)
            send(s)  # the round: seal, Redis stores all, settle
            # and forget what no failover can lose any more, as the session's round does
            s.outbox.retained.prune(lambda: s.local_leases() + s.outbox.held_pairs())
            active.clear()  # downloaded and parsed: finished
            s.inflight.collect_finished()
            s.outbox.acks.clear()

    return run


def scrapy_run() -> Callable[[int], None]:
    """Scrapy's scheduler (memory queues), built: a function that puts *n* requests through
    it (enqueue, next)."""
    crawler = get_crawler(Spider)
    crawler._apply_settings()
    crawler.engine = FakeEngine()  # type: ignore[assignment]
    crawler.stats.open_spider()
    scheduler = ScrapyScheduler.from_crawler(crawler)
    scheduler.open(Spider("bench"))

    def run(n: int) -> None:
        urls = _urls(n)
        for i in range(0, n, PER_PAGE):
            for url in urls[i : i + PER_PAGE]:
                scheduler.enqueue_request(_request(url))
            while scheduler.next_request() is not None:
                pass

    return run


#: The parts ``--instructions`` and the timed run measure, by name.
PARTS: dict[str, Callable[[], Callable[[int], None]]] = {"shell": shell_run, "scrapy": scrapy_run}


def built(part: str) -> Callable[[int], None]:
    """*part*, built and warmed up, with what was alive then frozen out of the garbage
    collector's passes, as a worker has it (``HA_GC_FREEZE``, and ``memory-freeze-tick``
    for Scrapy's scheduler): else every full collection walks this process's start-up
    heap, a cost that depends on what else the process imported, not on the part."""
    run = PARTS[part]()
    run(WARM_UP)
    gc.collect()
    gc.freeze()
    return run


def cpu_cost(part: str, n: int) -> float:
    """CPU seconds per request of *part*, built first (not timed)."""
    run = built(part)
    try:
        started = time.process_time()
        run(n)
        return (time.process_time() - started) / n
    finally:
        gc.unfreeze()


def collector_cost(part: str, n: int) -> tuple[float, float]:
    """Of *part*'s CPU per request, the garbage collector's (seconds), and its collections
    per 1,000 requests (``gc.callbacks``, built first). What a part keeps alive from one
    round to the next makes the collector run: Scrapy's scheduler keeps nothing alive but
    its fingerprints, which are not tracked objects."""
    run = built(part)
    spent, collections, started = [0.0], [0], [0.0]

    def timed(phase: str, info: dict[str, int]) -> None:  # noqa: ARG001 (the callback's)
        if phase == "start":
            started[0] = time.process_time()
        else:
            spent[0] += time.process_time() - started[0]
            collections[0] += 1

    gc.callbacks.append(timed)
    try:
        run(n)
    finally:
        gc.callbacks.remove(timed)
        gc.unfreeze()
    return spent[0] / n, collections[0] * 1000 / n


def instructions(part: str, n: int) -> float:
    """Instructions per request of *part* under valgrind's callgrind: only while the
    requests go through it (``sys.call_tracing`` marks that span for ``--toggle-collect``),
    built and warmed up before. Repeatable to a fraction of a percent, whatever else the
    machine runs."""
    command = ["valgrind", "--tool=callgrind", "--collect-atstart=no"]
    command += ["--toggle-collect=_PyEval_CallTracing", "--callgrind-out-file=/dev/null"]
    command += [sys.executable, __file__, "--count", part, "--requests", str(n)]
    command += ["--shape", _SHAPE[0]]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    collected = re.search(r"Collected : (\d+)", done.stderr)
    if collected is None:
        raise RuntimeError(f"no instruction count from callgrind:\n{done.stderr[-2000:]}")
    return int(collected.group(1)) / n


def _count(part: str, n: int) -> None:
    """Run inside callgrind: build, then *n* requests inside ``sys.call_tracing``."""
    sys.call_tracing(built(part), (n,))


async def round_cost(port: int, size: int, rounds: int) -> float:
    """CPU seconds per sync round that enqueues, acks and leases *size* requests each."""
    # built as a worker builds its client (scrapy_ha.store.connection: hiredis packs)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis_from_settings(Settings({"REDIS_URL": url}), connect_timeout=5)
    await client.flushall()
    queue = RedisQueue(client, Keys("ha", "bench"))
    await queue.sync(enqueue=queue_micro.entries(0, size), lease=size)  # warm: the script is loaded
    held: list[tuple[str, str]] = []
    sent = size
    started = time.process_time()
    for _ in range(rounds):
        result = await queue.sync(enqueue=queue_micro.entries(sent, size), ack=held, lease=size)
        sent += size
        held = [(lease.id, lease.token) for lease in result.leases]
    cost = (time.process_time() - started) / rounds
    await client.aclose()
    return cost


def _line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares: (fixed, per request)."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    slope, intercept = statistics.linear_regression(xs, ys)
    return intercept, slope


def _instructions_result(counts: dict[str, float]) -> dict[str, Any]:
    result: dict[str, Any] = {
        f"{part}_instructions_per_request": round(n) for part, n in counts.items()
    }
    if "shell" in counts and "scrapy" in counts:
        result["ratio"] = round(counts["shell"] / counts["scrapy"], 3)
    return result


def _parser() -> str:
    from redis.utils import HIREDIS_AVAILABLE

    return "hiredis" if HIREDIS_AVAILABLE else "python"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000, help="per shell run")
    parser.add_argument("--rounds", type=int, default=1_000, help="per round size")
    parser.add_argument("--repeats", type=int, default=5, help="alternated pairs, rounds")
    parser.add_argument("--no-round", action="store_true", help="time the shell only")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count the shell's and Scrapy's instructions per request under callgrind "
        "(valgrind) instead of timing them; no round",
    )
    parser.add_argument(
        "--parts", default="shell,scrapy", help="with --instructions: which to count"
    )
    parser.add_argument(
        "--shape",
        choices=SHAPES,
        default="bare",
        help="the requests: bare Request(url), or as a crawl's (a Referer, depth, compacted)",
    )
    parser.add_argument("--count", choices=sorted(PARTS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    _SHAPE[0] = args.shape
    if args.count:
        _count(args.count, args.requests)
        return 0
    if args.instructions:
        counts = {part: instructions(part, args.requests) for part in args.parts.split(",")}
        print(json.dumps(_instructions_result(counts), indent=1))
        return 0
    # alternated, so that both see the same load; the ratio is the median of the pairs'
    pairs = [
        (cpu_cost("shell", args.requests), cpu_cost("scrapy", args.requests))
        for _ in range(args.repeats)
    ]
    ours = statistics.median(shell for shell, _ in pairs)
    theirs = statistics.median(scrapy for _, scrapy in pairs)
    ratio = statistics.median(shell / scrapy for shell, scrapy in pairs)
    collector = {part: collector_cost(part, args.requests) for part in PARTS}
    result: dict[str, Any] = {
        "shell_us_per_request": round(ours * US, 1),
        "scrapy_scheduler_us_per_request": round(theirs * US, 1),
        "shell_minus_scrapy_us": round((ours - theirs) * US, 1),
        "ratio": round(ratio, 3),
        "collector_us_per_request": {p: round(c[0] * US, 2) for p, c in collector.items()},
        "collections_per_1000_requests": {p: round(c[1], 1) for p, c in collector.items()},
        "load_average": round(os.getloadavg()[0], 1),
        "shape": args.shape,
    }
    if not args.no_round:
        result.update(_rounds(args.repeats, args.rounds))
    print(json.dumps(result, indent=1))
    return 0


def _rounds(repeats: int, rounds: int) -> dict[str, Any]:
    """The round benchmark's figures (see the module docstring)."""
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = harness.start_redis(Path(tmp) / "redis")
        try:
            points = [
                (
                    size,
                    statistics.median(
                        asyncio.run(round_cost(port, size, rounds)) for _ in range(repeats)
                    ),
                )
                for size in ROUND_SIZES
            ]
        finally:
            harness.stop(proc)
    fixed, per_request = _line(points)
    return {
        "round_us": {str(size): round(cost * US) for size, cost in points},
        "round_fixed_us": round(fixed * US),
        "round_us_per_request": round(per_request * US, 1),
        "reply_parser": _parser(),
    }


if __name__ == "__main__":
    sys.exit(main())
