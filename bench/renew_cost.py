"""Redis CPU per renew.lua call: a full renewal (every held lease) against an early report
(only the leases handed out since the last call). Starts its own redis-server on a free
port; prints one JSON object (µs per call from ``INFO commandstats``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import tempfile
import time
from typing import Any

import redis
import redis.asyncio

from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.renew_wire import renew_args, worker_stats
from scrapy_ha.store.scripts import RENEW_LUA
from scrapy_ha.store.wire import NewEntry

KEYS = Keys("ha", "renewbench")
#: Long enough that no lease expires while the benchmark runs.
LEASE_MS = 600_000
#: Seconds to wait for the redis-server to answer.
START_DEADLINE = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def lease_pairs(url: str, n: int) -> list[tuple[str, str]]:
    q = RedisQueue(redis.asyncio.Redis.from_url(url), KEYS)
    urls = [f"http://a.test/{i}" for i in range(n)]
    await q.sync(
        enqueue=[NewEntry(u.encode(), 0, json.dumps({"v": 1, "u": u}).encode()) for u in urls]
    )
    leases = (await q.sync(lease=n, lease_ms=LEASE_MS, promote=n)).leases
    await q.client.aclose()
    return [(lease.id, lease.token) for lease in leases]


def usec_per_call(client: Any, pairs: list[tuple[str, str]], calls: int) -> float:
    script = client.register_script(RENEW_LUA)
    keys = [KEYS.leased, KEYS.leases, KEYS.workers, KEYS.worker_stats]
    args = renew_args(
        pairs,
        pairs,
        worker="w",
        lease_ms=LEASE_MS,
        heartbeat_ms=30_000,
        stats=worker_stats(len(pairs), 1.0),
    )
    script(keys=keys, args=args)  # loads the script, marks the pairs handed once
    client.config_resetstat()
    for _ in range(calls):
        script(keys=keys, args=args)
    return float(client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--held", type=int, default=64, help="leases a worker holds")
    parser.add_argument(
        "--new", type=int, default=1, help="leases handed out between two early reports"
    )
    parser.add_argument("--calls", type=int, default=300)
    opts = parser.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        server = subprocess.Popen(
            ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", tmp],
            stdout=subprocess.DEVNULL,
        )
        try:
            url = f"redis://127.0.0.1:{port}/0"
            client = redis.Redis.from_url(url)
            deadline = time.monotonic() + START_DEADLINE
            while True:
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            pairs = asyncio.run(lease_pairs(url, opts.held))
            full = usec_per_call(client, pairs, opts.calls)
            early = usec_per_call(client, pairs[: opts.new], opts.calls)
            print(
                json.dumps({"held": opts.held, "new": opts.new, "full_us": full, "early_us": early})
            )
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
