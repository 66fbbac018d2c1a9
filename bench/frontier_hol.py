"""Head of line: does one slow or gated host hold back a crawl's other hosts?

50 fast hosts (``127.0.1.1`` to ``127.0.1.50``, each a loopback address of its own, so
Scrapy and scrapy-ha see 50 domains) and one more host (``127.0.2.1``), all served by one
local server of this file: a fast host answers at once; the other answers after
``--slow`` seconds (``slow``), or answers 429 with ``Retry-After: --gate`` (``gate``). The
queue is filled before the workers start with ``--requests`` requests spread evenly over the
hosts, in turn (the other host holds one host's share); ``--workers`` Scrapy processes with
scrapy-ha's add-on and ``HA_DOMAIN_CONCURRENCY`` crawl them. The server counts the fast
hosts' pages and times them; once every fast page was served the workers are killed. The
fast hosts' pages per second, with and without the other host (``none``: the same fast
requests alone), says what it cost them.

    python bench/frontier_hol.py --kinds none,slow,gate --rounds 2
    python bench/frontier_hol.py --kinds none,slow --trees /tmp/old,.   # two versions
    python bench/frontier_hol.py --kinds none,slow,gate --rounds 3 --together

``--together`` runs the kinds' crawls at the same time, each with its own Redis, site and
workers, so that a machine whose load moves loads each alike; each kind's rate is counted
over the window in which all of them were crawling.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after PYTHONPATH: a tree given there is the one measured

import scrapy  # noqa: E402

#: The fast hosts: 127.0.1.1 to 127.0.1.<FAST_HOSTS>.
FAST_HOSTS = 50
#: The other host's address.
OTHER = "127.0.2.1"


class HolSpider(scrapy.Spider):
    """Crawls what the queue holds: each page is a leaf."""

    name = "hol"

    async def start(self) -> Any:
        return
        yield  # an async generator that yields nothing

    def parse_page(self, response: Any) -> None:
        pass


# -- the server --------------------------------------------------------------------------


def serve(port: int, slow: float, gate: int) -> None:
    from twisted.internet import reactor
    from twisted.web import resource, server

    stats = {"fast": 0, "first": 0.0, "last": 0.0, "other": 0}
    times: list[float] = []  # each fast page's time, in order

    class Pages(resource.Resource):
        isLeaf = True

        def render_GET(self, request: Any) -> bytes:
            path = request.path.decode()
            if path == "/_stats":
                return json.dumps(stats).encode()
            if path == "/_count":  # the fast pages served in [from, to]
                low, high = (float(request.args[k][0]) for k in (b"from", b"to"))
                count = bisect.bisect_right(times, high) - bisect.bisect_left(times, low)
                return json.dumps(count).encode()
            if path.startswith("/fast/"):
                now = time.time()
                times.append(now)
                stats["fast"] += 1
                stats["first"] = stats["first"] or now
                stats["last"] = now
                return b"<html><body>a fast page</body></html>"
            stats["other"] += 1
            if path.startswith("/gate/"):
                request.setResponseCode(429)
                request.setHeader(b"retry-after", str(gate).encode())
                return b"slow down"

            def finish() -> None:
                if not request._disconnected:
                    request.write(b"<html><body>a slow page</body></html>")
                    request.finish()

            reactor.callLater(slow, finish)  # type: ignore[attr-defined]
            return server.NOT_DONE_YET

    site = server.Site(Pages())
    for ip in [f"127.0.1.{i}" for i in range(1, FAST_HOSTS + 1)] + [OTHER]:
        reactor.listenTCP(port, site, interface=ip)  # type: ignore[attr-defined]
    print("LISTENING", flush=True)
    reactor.run()  # type: ignore[attr-defined]


# -- the workers ---------------------------------------------------------------------------


def work(redis_url: str, concurrency: int) -> None:
    from scrapy.crawler import CrawlerProcess

    settings = {
        "ADDONS": {"scrapy_ha.Addon": 0},
        "SCHEDULER": "scrapy_ha.Scheduler",
        "REDIS_URL": redis_url,
        "HA_DOMAIN_CONCURRENCY": concurrency,
        "HA_IDLE_TIMEOUT": 3600,
        "CONCURRENT_REQUESTS": 32,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
        "DOWNLOAD_TIMEOUT": 30,
        "ROBOTSTXT_OBEY": False,
        "COOKIES_ENABLED": False,
        "TELNETCONSOLE_ENABLED": False,
        "REMOTE_CONTROL_ENABLED": False,
        "LOG_LEVEL": "WARNING",
    }
    process = CrawlerProcess(settings)
    process.crawl(HolSpider)
    process.start()


# -- one crawl -------------------------------------------------------------------------------


def _urls(kind: str, port: int, n: int) -> list[tuple[str, str]]:
    """(host, url) of the crawl's requests, the hosts in turn."""
    hosts = [f"127.0.1.{i}" for i in range(1, FAST_HOSTS + 1)]
    per_host = n // (FAST_HOSTS + 1)
    out = []
    for k in range(per_host):
        for h in hosts:
            out.append((h, f"http://{h}:{port}/fast/{k}"))
        if kind != "none":
            out.append((OTHER, f"http://{OTHER}:{port}/{kind}/{k}"))
    return out


async def _fill(redis_url: str, urls: list[tuple[str, str]]) -> None:
    import redis.asyncio

    from scrapy_ha.codec import encode_request
    from scrapy_ha.keys import Keys
    from scrapy_ha.store.queue import RedisQueue
    from scrapy_ha.store.wire import NewEntry

    hosted = "host" in getattr(NewEntry, "__dataclass_fields__", {})
    spider = HolSpider()
    client = redis.asyncio.Redis.from_url(redis_url)
    queue = RedisQueue(client, Keys("ha", HolSpider.name))
    for start in range(0, len(urls), 1000):
        entries = []
        for host, u in urls[start : start + 1000]:
            payload = encode_request(scrapy.Request(u, callback=spider.parse_page), spider)
            fp = hashlib.sha1(u.encode()).digest()[:12]  # noqa: S324
            extra = {"host": host} if hosted else {}
            entries.append(NewEntry(fp, 0, payload, None, **extra))
        await queue.enqueue(entries)
    await client.aclose()


def _stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.1.1:{port}/_stats", timeout=10) as r:  # noqa: S310
        return json.loads(r.read())


class Crawl:
    """One kind's crawl: its Redis, its site, its queue filled, its workers."""

    def __init__(self, args: argparse.Namespace, kind: str, stack: contextlib.ExitStack) -> None:
        from scrapy_ha.demo.harness import free_port
        from tests import redis_servers

        self.args, self.kind = args, kind
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        redis_server = redis_servers.start(Path(tmp), "--appendonly", "no", "--save", "")
        stack.callback(redis_server.kill)
        self.redis_url = f"redis://127.0.0.1:{redis_server.port}/0"
        self.port = port = free_port()
        site = subprocess.Popen(
            [*ME, "serve", "--port", str(port), "--slow", str(args.slow), "--gate", str(args.gate)],
            stdout=subprocess.PIPE,
            text=True,
        )
        stack.callback(_end, site)
        assert site.stdout is not None and site.stdout.readline().startswith("LISTENING")
        urls = _urls(kind, port, args.requests)
        self.fast = sum(1 for h, _ in urls if h != OTHER)
        asyncio.run(_fill(self.redis_url, urls))
        self.stack = stack

    def start(self) -> None:
        for _ in range(self.args.workers):  # in this process's group: stopped with the bench
            argv = ["work", "--redis-url", self.redis_url, "--concurrency"]
            self.stack.callback(_end, subprocess.Popen([*ME, *argv, str(self.args.concurrency)]))

    def stats(self) -> dict[str, Any]:
        return _stats(self.port)

    def done(self) -> bool:
        return bool(self.stats()["fast"] >= self.fast)

    def count(self, low: float, high: float) -> int:
        url = f"http://127.0.1.1:{self.port}/_count?from={low}&to={high}"
        with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310
            return int(json.loads(r.read()))

    def result(self, stats: dict[str, Any]) -> dict[str, Any]:
        span = stats["last"] - stats["first"]
        return {
            "kind": self.kind,
            "fast_pages": stats["fast"],
            "fast_expected": self.fast,
            "other_hits": stats["other"],
            "seconds": round(span, 1),
            "fast_pages_per_s": round(stats["fast"] / span, 1) if span > 0 else 0.0,
        }


ME = [sys.executable, __file__]


def _end(proc: subprocess.Popen[Any]) -> None:
    proc.kill()
    proc.wait()


def _wait(crawls: list[Crawl], timeout: float) -> None:
    started = time.time()
    while not all(c.done() for c in crawls) and time.time() - started < timeout:
        time.sleep(1.0)


def crawl(args: argparse.Namespace, kind: str) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        one = Crawl(args, kind, stack)
        one.start()
        _wait([one], args.timeout)
        return one.result(one.stats())


def together(args: argparse.Namespace, kinds: list[str]) -> dict[str, Any]:
    """The kinds' crawls at the same time, so that whatever else loads the machine loads
    each alike: each kind's fast pages per second over the window in which every kind was
    crawling (from the last first fast page to the first last one)."""
    with contextlib.ExitStack() as stack:
        crawls = [Crawl(args, kind, stack) for kind in kinds]
        for c in crawls:
            c.start()
        _wait(crawls, args.timeout)
        stats = [c.stats() for c in crawls]
        low, high = max(s["first"] for s in stats), min(s["last"] for s in stats)
        window = {c.kind: c.count(low, high) for c in crawls}
    return {
        "window_seconds": round(high - low, 1),
        "fast_pages_per_s": {k: round(n / (high - low), 1) for k, n in window.items()},
        "runs": [c.result(s) for c, s in zip(crawls, stats, strict=True)],
    }


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """Every kind (and tree) once per round, the order alternated round by round."""
    trees = [str(Path(t).resolve()) for t in args.trees.split(",")] if args.trees else [""]
    runs: dict[str, list[dict[str, Any]]] = {}
    plan = [(t, k) for t in trees for k in args.kinds.split(",")]
    for r in range(args.rounds):
        for tree, kind in plan if r % 2 == 0 else plan[::-1]:
            env = {**os.environ, "PYTHONPATH": tree} if tree else dict(os.environ)
            argv = [*sys.argv[1:], "--kinds", kind, "--rounds", "1", "--trees", ""]
            done = subprocess.run(
                [sys.executable, __file__, *argv], env=env, check=True, capture_output=True
            )
            result = json.loads(done.stdout.decode().strip().splitlines()[-1])
            runs.setdefault(f"{tree} {kind}".strip(), []).append(result)
            print(f"{tree} {kind}", os.getloadavg()[0], json.dumps(result), file=sys.stderr)
    medians = {
        name: statistics.median(r["fast_pages_per_s"] for r in found)
        for name, found in runs.items()
    }
    return {"runs": runs, "median_fast_pages_per_s": medians}


def rounds_together(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`together` per round; each kind's ratio to ``none`` per round, and medians."""
    kinds = args.kinds.split(",")
    rounds = []
    for r in range(args.rounds):
        found = together(args, kinds if r % 2 == 0 else kinds[::-1])
        rates = found["fast_pages_per_s"]
        if "none" in rates:
            found["ratio_to_none"] = {k: round(v / rates["none"], 3) for k, v in rates.items()}
        print(os.getloadavg()[0], json.dumps(found), file=sys.stderr, flush=True)
        rounds.append(found)
    ratios: dict[str, list[float]] = {}
    for found in rounds:
        for k, v in found.get("ratio_to_none", {}).items():
            ratios.setdefault(k, []).append(v)
    return {
        "rounds": rounds,
        "median_ratio_to_none": {k: statistics.median(v) for k, v in ratios.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", default="bench", choices=("bench", "serve", "work"))
    parser.add_argument("--kinds", default="none,slow,gate", help="none, slow, gate")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=2, help="HA_DOMAIN_CONCURRENCY")
    parser.add_argument("--slow", type=float, default=3.0, help="seconds a slow page takes")
    parser.add_argument("--gate", type=int, default=60, help="the gated host's Retry-After")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a crawl may take")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--trees", default="", help="compare these trees (comma-separated)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--redis-url", default="")
    parser.add_argument(
        "--together",
        action="store_true",
        help="run the kinds at the same time, in each round, the start order alternated",
    )
    args = parser.parse_args()
    if args.mode == "serve":
        serve(args.port, args.slow, args.gate)
    elif args.mode == "work":
        work(args.redis_url, args.concurrency)
    elif args.together:
        print(json.dumps(rounds_together(args)))
    elif args.rounds > 1 or args.trees or "," in args.kinds:
        print(json.dumps(compare(args)))
    else:
        print(json.dumps(crawl(args, args.kinds)))


if __name__ == "__main__":
    main()
