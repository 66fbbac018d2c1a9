"""How far one Redis goes: simulated workers enqueue, lease and ack at crawl rates, and
Redis's own CPU is read before and after (``INFO cpu``, every master of a cluster).

Each simulated worker is a process running the scheduler's queue (``RedisQueue`` or, with
``--shards``, ``ShardedQueue``) the way a worker's rounds use it: one ``sync`` call per round
stores the children of the pages finished since the last round (one new request per page,
fenced by its page's lease, so the frontier stays the same size), acks those pages and
leases as many again. ``--batch``
requests per round is what a busy worker carries (scrapy-ha's rounds carry about 10 at
400 pages/s: 0.07 to 0.10 script calls per page, docs/benchmarks.md). The lease keeper's
renewals (one call per worker every ``HA_LEASE_RENEW_INTERVAL``) are left out: a few
hundred µs every 10 s per worker.

Reported: the crawl-wide requests/s the workers got, the Redis CPU (user + sys) spent per
request, the share of a core Redis used, and from these the requests/s one Redis core
sustains and the number of 400-pages/s workers that is. ``top_commands``: the commands that took
the most time (``INFO commandstats`` before and after the run), per request;
``script_time``: the script calls' time per request split into the commands they ran and
the Lua code itself. On a machine with fewer cores than
Redis and the workers need, Redis does not reach 100 % of a core: the per-request CPU is
what is measured, the rate one core sustains is that figure's inverse.

    python bench/capacity.py --workers 4 --seconds 20            # one Redis
    python bench/capacity.py --workers 4 --seconds 20 --cluster  # 3 masters, 3 shards
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster

ROOT = Path(__file__).resolve().parent.parent
# after what is on the path already: a bench's --tree, put first, is the package measured
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from scrapy_ha.store.sharding import make_queue  # noqa: E402
from scrapy_ha.store.wire import NewEntry  # noqa: E402
from tests import redis_servers  # noqa: E402

#: Requests queued before the workers start: the frontier every round draws from.
FRONTIER = 20_000
#: The commands that run a script: EVALSHA, or FCALL of the library (Redis 7+).
SCRIPT_CALLS = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall")
#: A worker that reaches this many pages/s is the "400-pages/s worker" of the sizing.
WORKER_RATE = 400


def entries(
    worker: int, start: int, n: int, parents: list[tuple[str, str]] | None = None
) -> list[NewEntry]:
    """*n* new requests over 50 sites; each child of *parents* (one per page) is fenced by
    that page's lease, as a crawl's children are."""
    out = []
    for i in range(start, start + n):
        url = f"http://site-{i % 50}.example/item/{worker}/{i}"
        payload = json.dumps({"v": 1, "u": url, "cb": "parse_item"}, separators=(",", ":"))
        fingerprint = hashlib.sha1(url.encode()).digest()[:12]  # noqa: S324
        parent = parents[i - start] if parents else None
        out.append(NewEntry(fingerprint, 0, payload.encode(), parent))
    return out


def _client(port: int, cluster: bool) -> Any:
    if cluster:
        return redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=port)
    return redis.asyncio.Redis(port=port)


async def _prefill(port: int, cluster: bool, shards: int) -> None:
    client = _client(port, cluster)
    q = make_queue(client, "ha", "cap", shards)
    for start in range(0, FRONTIER, 1000):
        await q.sync(enqueue=entries(-1, start, 1000))
    await client.aclose()


async def _work(port: int, cluster: bool, shards: int, me: int, batch: int, until: float) -> int:
    """Rounds until *until* (a wall-clock time); returns the requests acked."""
    client = _client(port, cluster)
    q = make_queue(client, "ha", "cap", shards, worker=f"w{me}")
    acks: list[tuple[str, str]] = []
    made, done = 0, 0
    while time.time() < until:
        children = entries(me, made, len(acks), acks)
        made += len(acks)
        result = await q.sync(
            enqueue=children, ack=acks, lease=batch, lease_ms=60_000, worker=f"w{me}"
        )
        done += result.acked
        acks = [(lease.id, lease.token) for lease in result.leases]
    await q.sync(ack=acks)
    await client.aclose()
    return done


def _worker(
    port: int, cluster: bool, shards: int, me: int, batch: int, until: float, out: Any
) -> None:
    out.put(asyncio.run(_work(port, cluster, shards, me, batch, until)))


def redis_cpu(ports: list[int]) -> list[float]:
    """CPU seconds (user + sys) each server has used so far."""
    out = []
    for port in ports:
        with redis.Redis(port=port) as client:
            info = client.info("cpu")
        out.append(float(info["used_cpu_user"]) + float(info["used_cpu_sys"]))
    return out


def command_usec(ports: list[int]) -> dict[str, tuple[int, int]]:
    """Calls and µs per command, summed over the servers (those run by scripts included)."""
    out: dict[str, tuple[int, int]] = {}
    for port in ports:
        with redis.Redis(port=port) as client:
            for name, stat in client.info("commandstats").items():
                calls, usec = out.get(name, (0, 0))
                out[name] = (calls + int(stat["calls"]), usec + int(stat["usec"]))
    return out


def top_commands(before: dict, after: dict, requests: int, n: int = 12) -> dict[str, Any]:
    """The commands that took the most Redis time between the two readings: µs per request
    and calls per request (``fcall``'s or ``evalsha``'s time includes the commands its
    scripts ran)."""
    delta = {
        name: (calls - before.get(name, (0, 0))[0], usec - before.get(name, (0, 0))[1])
        for name, (calls, usec) in after.items()
    }
    ranked = sorted(delta.items(), key=lambda kv: -kv[1][1])[:n]
    return {
        name.removeprefix("cmdstat_"): {
            "us_per_request": round(usec / requests, 2),
            "calls_per_request": round(calls / requests, 3),
        }
        for name, (calls, usec) in ranked
    }


def lua_split(before: dict, after: dict, requests: int) -> dict[str, float]:
    """The script calls' time per request split in two: the Redis commands the scripts ran
    (every command but the script calls themselves, as only scripts run here) and the rest,
    the Lua code itself."""
    delta = {
        name: usec - before.get(name, (0, 0))[1]
        for name, (_, usec) in after.items()
        if name.startswith("cmdstat_")
    }
    scripts = sum(v for k, v in delta.items() if k in SCRIPT_CALLS)
    commands = sum(v for k, v in delta.items() if k not in (*SCRIPT_CALLS, "cmdstat_info"))
    return {
        "scripts_us_per_request": round(scripts / requests, 2),
        "commands_in_scripts_us_per_request": round(commands / requests, 2),
        "lua_us_per_request": round((scripts - commands) / requests, 2),
    }


def idle_cpu(ports: list[int], seconds: float) -> list[float]:
    """CPU seconds per second each server uses with no client (a cluster's bus, cron)."""
    before = redis_cpu(ports)
    time.sleep(seconds)
    return [(b - a) / seconds for a, b in zip(before, redis_cpu(ports), strict=True)]


def measure(port: int, masters: list[int], *, cluster: bool, shards: int, args: Any) -> dict:
    asyncio.run(_prefill(port, cluster, shards))
    idle = idle_cpu(masters, args.idle)
    results: Any = multiprocessing.Queue()
    start_at = time.time() + 2.0  # every process imported and connected: they start at once
    until = start_at + args.seconds
    procs = [
        multiprocessing.Process(
            target=_worker, args=(port, cluster, shards, i, args.batch, until, results)
        )
        for i in range(args.workers)
    ]
    for proc in procs:
        proc.start()
    time.sleep(max(0.0, start_at - time.time()))
    cpu0, t0, cmd0 = redis_cpu(masters), time.monotonic(), command_usec(masters)
    done = sum(results.get(timeout=args.seconds + 60) for _ in procs)
    cpu1, t1, cmd1 = redis_cpu(masters), time.monotonic(), command_usec(masters)
    for proc in procs:
        proc.join()
    wall = t1 - t0
    # what each server spent on the workers: its CPU over the run less its idle rate
    busy = [b - a - i * wall for a, b, i in zip(cpu0, cpu1, idle, strict=True)]
    per_request_us = sum(busy) / done * 1e6
    per_core = 1e6 / per_request_us
    return {
        "servers": len(masters),
        "shards": shards,
        "workers": args.workers,
        "batch": args.batch,
        "requests": done,
        "requests_per_s": round(done / wall),
        "redis_cpu_us_per_request": round(per_request_us, 1),
        "redis_core_share": [round(b / wall, 2) for b in busy],
        "idle_core_share": [round(i, 3) for i in idle],
        # the busiest server is the limit: the rate at which it would use a whole core
        "requests_per_s_at_full_core": round(done / wall / (max(busy) / wall)),
        "requests_per_s_per_redis_core": round(per_core),
        "workers_at_400_pages_s": round(done / wall / (max(busy) / wall) / WORKER_RATE),
        "top_commands": top_commands(cmd0, cmd1, done),
        "script_time": lua_split(cmd0, cmd1, done),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--batch", type=int, default=10, help="requests per round")
    parser.add_argument("--idle", type=float, default=3.0, help="seconds of idle baseline")
    parser.add_argument("--cluster", action="store_true", help="3 masters, --shards 3")
    parser.add_argument("--shards", type=int, default=0, help="default: 1, or 3 on --cluster")
    args = parser.parse_args()
    shards = args.shards or (3 if args.cluster else 1)
    with tempfile.TemporaryDirectory() as tmp:
        if args.cluster:
            found = redis_servers.start_cluster(Path(tmp), masters=3, replicas=0)
            try:
                masters = found.masters()
                result = measure(masters[0], masters, cluster=True, shards=shards, args=args)
            finally:
                found.stop()
        else:
            server = redis_servers.start(Path(tmp) / "one")
            try:
                result = measure(
                    server.port, [server.port], cluster=False, shards=shards, args=args
                )
            finally:
                server.kill()
    result["cpus"] = os.cpu_count()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
