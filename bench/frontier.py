"""A frontier at scale: what a pending request costs in Redis memory, what a request costs
Redis's CPU from enqueue to ack, and whether a slow or gated host holds back the others.

``memory``: a fresh redis-server, N requests with realistic URLs (``https://www.example-shop-
<host>.com/catalogue/category/books_<m>/item-<k>/index.html?ref=list``, about 95
characters, over ``--hosts`` hosts) enqueued as a worker enqueues them (the codec's payload,
Scrapy's fingerprint), ``used_memory`` before and after: bytes per pending request, and of
that the dupefilter's (``MEMORY USAGE``, per seen URL): the exact set in buckets as a worker
with the default ``HA_DUPEFILTER_CAPACITY`` makes them, or with ``--single-set`` the single
set of a crawl made before the buckets (or of a tree before them).

``cpu``: a fresh redis-server with ``--frontier`` requests queued, then ``--workers``
processes that do what a busy worker's rounds do, as fast as they can, for ``--seconds``:
one ``sync`` call per round stores one child per page finished since the last round (fenced
by that page's lease), acks those pages and leases ``--batch`` more. Redis's CPU (``INFO
cpu``) over the run divided by the requests acked is the Redis CPU a request costs (its
enqueue, its lease and its ack); its inverse, the requests one Redis core carries.
``INFO commandstats`` says where the time went.

``--trees A,B`` runs a mode once per tree and round, alternated (``PYTHONPATH=<tree>``), and
prints each run and the medians: two versions compared under the same load.

Requests are stored as a worker of the tree measured stores them: compacted with a
dictionary trained from the crawl's first requests when the tree compacts
(``HA_COMPACT_PAYLOADS``), plain with ``--plain`` or in a tree before compaction. The
head-of-line crawls are ``bench/frontier_hol.py``.

    python bench/frontier.py memory --pending 1000000,10000000
    python bench/frontier.py memory --pending 1000000 --plain
    python bench/frontier.py cpu --batch 10 --trees /tmp/old,. --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
import redis.asyncio

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after PYTHONPATH: a tree given there is the one measured

from scrapy_ha.keys import Keys  # noqa: E402
from scrapy_ha.store.queue import RedisQueue  # noqa: E402

try:  # a tree before the exact set's buckets has none
    from scrapy_ha.config.memory import DEFAULT_DUPEFILTER_CAPACITY
    from scrapy_ha.store.buckets import BucketSet, bucket_count
except ImportError:  # pragma: no cover
    BucketSet = None
from scrapy_ha.store.wire import NewEntry  # noqa: E402
from tests import redis_servers  # noqa: E402

#: The spider of the benchmark crawl's requests.
SPIDER = "frontier"
#: Requests per enqueue call when the frontier is filled (a busy worker's batch).
FILL_BATCH = 5000


def url(host: int, k: int) -> str:
    """A realistic URL (about 95 characters): a shop's item page with a tracking query."""
    return (
        f"https://www.example-shop-{host}.com/catalogue/category/books_{k % 50}/"
        f"item-{k}/index.html?ref=list"
    )


class Encoder:
    """Requests as a worker stores them: the codec's payload of ``Request(url,
    callback=spider.parse_item)`` and the fingerprint a worker keeps (12 bytes of Scrapy's);
    with the worker's own admission when the tree has one that makes the stored form."""

    def __init__(self) -> None:
        from scrapy import Request, Spider
        from scrapy.utils.request import RequestFingerprinter

        class Bench(Spider):
            name = SPIDER

            def parse_item(self, response: Any) -> None:
                pass

        self.spider = Bench()
        self.request_class = Request
        self.fingerprinter = RequestFingerprinter()

    def entry(self, host: int, k: int, parent: tuple[str, str] | None = None) -> NewEntry:
        from scrapy_ha.codec import encode_request

        request = self.request_class(url(host, k), callback=self.spider.parse_item)
        payload = encode_request(request, self.spider)
        fingerprint = self.fingerprinter.fingerprint(request)[:12]
        return NewEntry(fingerprint, 0, payload, parent)


try:  # the stored form of this tree: compacted with the crawl's dictionary, with its host
    from scrapy_ha.codec.compact import Dictionary, train
    from scrapy_ha.store.dictionary import SAMPLES
except ImportError:  # a tree before the back queues and compaction: plain, no host
    Dictionary = None  # type: ignore[assignment,misc]
HOSTED = "host" in getattr(NewEntry, "__dataclass_fields__", {})


def _document(u: str) -> bytes:
    return b'{"v":1,"u":"%s","cb":"parse_item"}' % u.encode()


class Stored:
    """What a worker of the tree measured stores: the document, compacted with a dictionary
    trained from the crawl's first requests when the tree compacts (and not ``--plain``)."""

    def __init__(self, hosts: int, compact: bool = True) -> None:
        self.hosts = hosts
        self.dictionary = None
        if compact and Dictionary is not None:
            first = [_document(url(k % hosts, k)) for k in range(SAMPLES)]
            self.dictionary = Dictionary(1, train(first))

    def entries(self, start: int, n: int, parents: list[Any] | None = None) -> list[Any]:
        """*n* entries as a worker makes them (its codec's payload, 12 bytes of a SHA-1 for
        the fingerprint: Scrapy's is one too), from number *start* on."""
        out = []
        for i in range(n):
            k = start + i
            host = k % self.hosts
            u = url(host, k)
            payload = _document(u)
            if self.dictionary is not None:
                payload = self.dictionary.compact(payload)
            fingerprint = hashlib.sha1(u.encode()).digest()[:12]  # noqa: S324
            parent = parents[i] if parents else None
            extra = {"host": f"www.example-shop-{host}.com"} if HOSTED else {}
            out.append(NewEntry(fingerprint, 0, payload, parent, **extra))
        return out


def fast_entries(hosts: int, start: int, n: int, parents: list[Any] | None = None) -> list[Any]:
    """*n* plain entries (see :class:`Stored`)."""
    return Stored(hosts, compact=False).entries(start, n, parents)


def check_fast() -> None:
    """The entries' documents are the codec's, byte for byte."""
    encoder = Encoder()
    for k in (0, 7, 123456):
        assert encoder.entry(k % 10, k).payload == fast_entries(10, k, 1)[0].payload


def start_redis(directory: Path) -> redis_servers.Server:
    return redis_servers.start(directory, "--appendonly", "no", "--save", "")


# -- memory ------------------------------------------------------------------------------


async def fill(port: int, n: int, hosts: int, compact: bool, single: bool) -> dict[str, Any]:
    client = redis.asyncio.Redis(port=port)
    queue = RedisQueue(client, Keys("ha", SPIDER))
    if BucketSet is not None and not single:
        queue.dupefilter = BucketSet(bucket_count(DEFAULT_DUPEFILTER_CAPACITY))
    stored = Stored(hosts, compact)
    await client.flushall()
    before = (await client.info("memory"))["used_memory"]
    started = time.perf_counter()
    for start in range(0, n, FILL_BATCH):
        result = await queue.sync(enqueue=stored.entries(start, min(FILL_BATCH, n - start)))
        assert result.added == min(FILL_BATCH, n - start), result
    seconds = time.perf_counter() - started
    after = (await client.info("memory"))["used_memory"]
    # every member counted up to 2 M (MEMORY USAGE walks them all: 10 M takes longer than a
    # client waits), sampled above
    samples = 0 if n <= 2_000_000 else 10_000
    dupefilter = int(await client.memory_usage(queue.keys.dupefilter, samples=samples) or 0)
    if BucketSet is not None and not single:  # the buckets and their meta hash, all counted
        names = [queue.keys.buckets] + [
            k async for k in client.scan_iter(match=queue.keys.buckets + ":*", count=10_000)
        ]
        for i in range(0, len(names), 1000):
            pipe = client.pipeline(transaction=False)
            for name in names[i : i + 1000]:
                pipe.memory_usage(name, samples=0)
            dupefilter += sum(int(x or 0) for x in await pipe.execute())
    counts = await queue.counts()
    await client.aclose()
    assert counts.pending == n, counts
    total = after - before
    return {
        "pending": n,
        "hosts": hosts,
        "compacted": stored.dictionary is not None,
        "dupefilter": "single set" if single or BucketSet is None else "buckets",
        "bytes_per_pending_request": round(total / n, 1),
        "of_which_dupefilter_per_seen_url": round(dupefilter / n, 1),
        "bytes_per_pending_request_without_dupefilter": round((total - dupefilter) / n, 1),
        "used_memory_mb": round(after / 2**20, 1),
        "enqueued_per_s": round(n / seconds),
    }


def memory(args: argparse.Namespace) -> list[dict[str, Any]]:
    check_fast()
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        server = start_redis(Path(tmp))
        try:
            for n in (int(x) for x in args.pending.split(",")):
                out.append(
                    asyncio.run(fill(server.port, n, args.hosts, not args.plain, args.single_set))
                )
        finally:
            server.kill()
    return out


# -- cpu ----------------------------------------------------------------------------------


async def _work(port: int, me: int, hosts: int, batch: int, until: float, compact: bool) -> int:
    """Rounds until *until* (wall clock): each stores a child of every page it acks."""
    stored = Stored(hosts, compact)
    client = redis.asyncio.Redis(port=port)
    queue = RedisQueue(client, Keys("ha", SPIDER))
    acks: list[tuple[str, str]] = []
    made, done = (me + 1) * 10**8, 0
    while time.time() < until:
        children = stored.entries(made, len(acks), acks)
        made += len(acks)
        result = await queue.sync(
            enqueue=children, ack=acks, lease=batch, lease_ms=60_000, worker=f"w{me}"
        )
        done += result.acked
        acks = [(lease.id, lease.token) for lease in result.leases]
    await queue.sync(ack=acks)
    await client.aclose()
    return done


def _worker(
    port: int, me: int, hosts: int, batch: int, until: float, compact: bool, out: Any
) -> None:
    out.put(asyncio.run(_work(port, me, hosts, batch, until, compact)))


def _redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _commands(client: redis.Redis) -> dict[str, tuple[int, int]]:
    stats = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"])) for k, v in stats.items()}


def cpu_once(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        server = start_redis(Path(tmp))
        try:
            client = server.client()

            async def prefill() -> None:
                c = redis.asyncio.Redis(port=server.port)
                q = RedisQueue(c, Keys("ha", SPIDER))
                for start in range(0, args.frontier, 1000):
                    await q.sync(enqueue=Stored(args.hosts, not args.plain).entries(start, 1000))
                await c.aclose()

            asyncio.run(prefill())
            results: Any = multiprocessing.Queue()
            start_at = time.time() + 2.0
            until = start_at + args.seconds
            procs = [
                multiprocessing.Process(
                    target=_worker,
                    args=(server.port, i, args.hosts, args.batch, until, not args.plain, results),
                )
                for i in range(args.workers)
            ]
            for proc in procs:
                proc.start()
            time.sleep(max(0.0, start_at - time.time()))
            cpu0, t0, cmd0 = _redis_cpu(client), time.monotonic(), _commands(client)
            done = sum(results.get(timeout=args.seconds + 60) for _ in procs)
            cpu1, t1, cmd1 = _redis_cpu(client), time.monotonic(), _commands(client)
            for proc in procs:
                proc.join()
        finally:
            server.kill()
    us = (cpu1 - cpu0) / done * 1e6
    top = sorted(
        (
            (name, calls - cmd0.get(name, (0, 0))[0], usec - cmd0.get(name, (0, 0))[1])
            for name, (calls, usec) in cmd1.items()
        ),
        key=lambda x: -x[2],
    )[:10]
    return {
        "batch": args.batch,
        "hosts": args.hosts,
        "workers": args.workers,
        "requests": done,
        "requests_per_s": round(done / (t1 - t0)),
        "redis_cpu_us_per_request": round(us, 2),
        "requests_per_s_per_redis_core": round(1e6 / us),
        "redis_core_share": round((cpu1 - cpu0) / (t1 - t0), 2),
        "commands": {
            name: {
                "us_per_request": round(usec / done, 2),
                "calls_per_request": round(calls / done, 3),
            }
            for name, calls, usec in top
        },
    }


# -- trees compared -------------------------------------------------------------------------


def compare(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """Run this mode in a subprocess per tree, alternating their order round by round."""
    trees = [str(Path(t).resolve()) for t in args.trees.split(",")]
    runs: dict[str, list[Any]] = {t: [] for t in trees}
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            env = {**os.environ, "PYTHONPATH": tree}
            cmd = [sys.executable, __file__, *argv, "--trees", ""]
            done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
            runs[tree].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(tree, json.dumps(runs[tree][-1]), file=sys.stderr, flush=True)
    out: dict[str, Any] = {"load_before": os.getloadavg(), "runs": runs, "medians": {}}
    for tree, found in runs.items():
        flat = [x if isinstance(x, dict) else x[-1] for x in found]
        medians = {
            key: statistics.median(f[key] for f in flat)
            for key, value in flat[0].items()
            if isinstance(value, (int, float))
        }
        out["medians"][tree] = medians
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("memory", "cpu"))
    parser.add_argument("--pending", default="1000000", help="memory: sizes, comma-separated")
    parser.add_argument("--hosts", type=int, default=0, help="default: 10000 memory, 50 cpu")
    parser.add_argument("--batch", type=int, default=10, help="cpu: requests per round")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--frontier", type=int, default=20_000, help="cpu: requests queued")
    parser.add_argument("--trees", default="", help="compare these trees (comma-separated)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plain", action="store_true", help="store plain documents")
    parser.add_argument("--single-set", action="store_true", help="the dupefilter's old form")
    args = parser.parse_args()
    args.hosts = args.hosts or (10_000 if args.mode == "memory" else 50)
    if args.trees:
        argv = [a for a in sys.argv[1:]]
        i = argv.index("--trees")
        del argv[i : i + 2]
        print(json.dumps(compare(args, argv)))
        return
    print(json.dumps(memory(args) if args.mode == "memory" else cpu_once(args)))


if __name__ == "__main__":
    main()
