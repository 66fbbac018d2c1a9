"""The sync script's Redis CPU split by what a call does, counted in instructions: where a
request's server cost goes, for the frontier issue's "say where the time went".

A redis-server under callgrind (``bench/script_cost.py``'s) holds a frontier of 20,000
requests over 50 sites; then, each measured apart, ``--rounds`` calls of one kind only,
``--batch`` requests each: ``lease`` (take the best heads of the back queues), ``enqueue``
(new requests, each fenced by one of those leases, as a page's children are), ``ack`` (end
those leases) and ``empty`` (a call with nothing to do: what any call costs). Each figure is
the server's instructions per request of that kind of call, so ``lease - empty`` is what a
leased request adds to a call, and so on; the three together are about ``script_cost.py``'s
figure, where one call does all three.

    python bench/script_phases.py --rounds 100 --batch 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
#: Lease length (ms) of the measured leases: longer than the run, so none expires.
LEASE_MS = 3_600_000


async def _phases(port: int, pid: int, args: Any) -> dict[str, float]:
    import capacity  # noqa: PLC0415 (imported after --tree is on the path)
    import redis.asyncio  # noqa: PLC0415

    from scrapy_ha.store.sharding import make_queue  # noqa: PLC0415

    client = redis.asyncio.Redis(port=port)
    q = make_queue(client, "ha", "cap", 1, worker="w0")
    for start in range(0, script_cost.FRONTIER, 1000):
        await q.sync(enqueue=capacity.entries(-1, start, 1000))
    n, rounds = args.batch, args.rounds
    leases: list[tuple[str, str]] = []
    made = script_cost.FRONTIER

    async def lease() -> None:
        for _ in range(rounds):
            result = await q.sync(lease=n, lease_ms=LEASE_MS, worker="w0")
            leases.extend((lease.id, lease.token) for lease in result.leases)

    async def enqueue() -> None:
        nonlocal made
        for i in range(rounds):
            await q.sync(enqueue=capacity.entries(0, made, n, leases[i * n : (i + 1) * n]))
            made += n

    async def ack() -> None:
        for i in range(rounds):
            await q.sync(ack=leases[i * n : (i + 1) * n])

    async def empty() -> None:
        for _ in range(rounds):
            await q.sync()

    await q.sync()  # the library loaded before the first count
    out = {}
    for dump, (name, phase) in enumerate(
        (("lease", lease), ("enqueue", enqueue), ("ack", ack), ("empty", empty)), 1
    ):
        subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
        await phase()
        subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
        out[name] = dump
    await client.aclose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--batch", type=int, default=10, help="requests per call")
    parser.add_argument("--tree", default=str(BENCH.parent))
    parser.add_argument("--server", help="this redis-server binary")
    parser.add_argument("--config", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    sys.path[:0] = [args.tree, str(BENCH)]
    global script_cost  # noqa: PLW0603 (imported after --tree is on the path)
    import script_cost  # noqa: PLC0415

    server = args.server or shutil.which("redis-server") or "redis-server"
    with tempfile.TemporaryDirectory() as tmp:
        proc = script_cost.start_server(server, port := script_cost._free_port(), tmp, args.config)
        try:
            dumps = asyncio.run(_phases(port, proc.pid, args))
            time.sleep(0.5)
            per = args.rounds * args.batch
            out = {k: round(script_cost._instructions(tmp, d) / per) for k, d in dumps.items()}
        finally:
            proc.terminate()
            proc.wait()
    added = {f"{k}_added": out[k] - out["empty"] for k in ("lease", "enqueue", "ack")}
    print(json.dumps({"tree": args.tree, "batch": args.batch, **out, **added}))


script_cost: Any = None

if __name__ == "__main__":
    main()
