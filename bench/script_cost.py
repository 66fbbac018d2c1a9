"""The Redis CPU of a crawl's rounds counted in instructions, which a loaded machine does
not change: a redis-server run under valgrind's callgrind, one simulated worker's rounds
as ``bench/capacity.py`` makes them (store one child per page finished, ack those pages,
lease ``--batch`` more, over 50 sites), and the instructions the server ran during
``--rounds`` rounds divided by the requests acked.

On a 2-core machine shared with other jobs the µs of ``bench/capacity.py`` move by 10 to
20 % from run to run; this count moves by about 1 % (the hash tables' random seeds), so a
change of a few percent in the scripts shows. It counts the server's work only (the
script calls and their commands, the event loop, the replies), at batch 10 about 3.3
million instructions per call.

``--tree`` measures another checkout's package with this file (``git worktree add /tmp/old
main``); ``--sync-file`` replaces the sync script by a file's text (an experiment: a piece
of the script taken out says what it costs); ``--config`` sets a redis-server setting for the
run (``zset-max-listpack-entries=0``: what the compact encodings cost); ``--gates N``
closes N other domains' gates for the run (what a crawl that many sites hold back with a
429 costs a round); ``--keep`` keeps callgrind's dump for ``callgrind_annotate``, and
``--server`` runs another redis-server binary (one built from Redis's source names the Lua
interpreter's functions, which Debian's stripped binary does not). Needs valgrind
(``callgrind_control``).

    python bench/script_cost.py --rounds 300 --batch 10
    python bench/script_cost.py --rounds 300 --batch 10 --tree /tmp/old
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import glob
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: Rounds run before the counters are zeroed: the scripts loaded, the frontier's queues read.
WARM_ROUNDS = 30
#: Requests queued before the rounds: the frontier every round draws from (capacity.py's).
FRONTIER = 20_000
#: Lease length (ms): longer than a run, so no lease expires while it is held.
LEASE_MS = 3_600_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _rounds(port: int, pid: int, args: Any) -> int:
    import capacity  # noqa: PLC0415 (imported after --tree is on the path)
    import redis.asyncio  # noqa: PLC0415

    from scrapy_ha.store.sharding import make_queue  # noqa: PLC0415

    client = redis.asyncio.Redis(port=port)
    q = make_queue(client, "ha", "cap", 1, worker="w0")
    for start in range(0, FRONTIER, 1000):
        await q.sync(enqueue=capacity.entries(-1, start, 1000))
    for n in range(args.gates):  # hosts of no request here, behind a 429's gate
        await q.close_gate(f"gated-{n}.test", LEASE_MS)
    acks: list[tuple[str, str]] = []
    made = 0
    # the leases held between rounds (--inflight): the oldest are acked first
    held: collections.deque[tuple[str, str]] = collections.deque()
    if args.inflight:
        result = await q.sync(lease=args.inflight, lease_ms=LEASE_MS, worker="w0")
        held.extend((lease.id, lease.token) for lease in result.leases)

    async def rounds(n: int) -> int:
        nonlocal acks, made
        done = 0
        for _ in range(n):
            children = capacity.entries(0, made, len(acks), acks)
            made += len(acks)
            result = await q.sync(
                enqueue=children, ack=acks, lease=args.batch, lease_ms=LEASE_MS, worker="w0"
            )
            done += result.acked
            held.extend((lease.id, lease.token) for lease in result.leases)
            acks = [held.popleft() for _ in range(min(args.batch, len(held) - args.inflight))]
        return done

    await rounds(WARM_ROUNDS)
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
    done = await rounds(args.rounds)
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    await client.aclose()
    return done


def start_server(server: str, port: int, directory: str, config: list[str]) -> Any:
    """A redis-server on *port* under callgrind, its dumps in *directory*, with the
    ``NAME=VALUE`` settings of *config*; returns its process once it answers."""
    import redis  # noqa: PLC0415

    settings = [
        part for item in config for part in ("--" + item.split("=", 1)[0], item.split("=", 1)[1])
    ]
    proc = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={directory}/cg.%p",
            server,
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            directory,
            *settings,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(300):
        try:
            redis.Redis(port=port).ping()
            break
        except redis.exceptions.ConnectionError:
            time.sleep(0.1)
    return proc


def _instructions(directory: str, dump: int = 1) -> int:
    """The instructions of the *dump*-th dump callgrind_control -d wrote (the part after
    zeroing)."""
    total = 0
    for path in glob.glob(f"{directory}/cg.*.{dump}"):
        for line in Path(path).read_text().splitlines():
            if line.startswith("summary:"):
                total = int(line.split()[1])
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--batch", type=int, default=10, help="requests per round")
    parser.add_argument(
        "--inflight",
        type=int,
        default=0,
        help="leases held between rounds besides a round's own (the crawl's requests in "
        "flight, all workers together; 0: a round acks the leases of the round before)",
    )
    parser.add_argument(
        "--gates", type=int, default=0, help="domains closed (a 429's gate) during the rounds"
    )
    parser.add_argument("--tree", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--sync-file", help="run this text as the sync script")
    parser.add_argument("--keep", help="copy callgrind's dump here (for callgrind_annotate)")
    parser.add_argument(
        "--server", help="this redis-server binary (one built with symbols names Lua's parts)"
    )
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a redis-server setting for the run (e.g. zset-max-listpack-entries=0), repeatable",
    )
    args = parser.parse_args()
    sys.path[:0] = [args.tree, str(Path(__file__).resolve().parent)]
    from scrapy_ha.store import scripts  # noqa: PLC0415

    if args.sync_file:
        scripts.SYNC_LUA = Path(args.sync_file).read_text()
    server = args.server or shutil.which("redis-server") or "redis-server"
    with tempfile.TemporaryDirectory() as tmp:
        port = _free_port()
        proc = start_server(server, port, tmp, args.config)
        try:
            done = asyncio.run(_rounds(port, proc.pid, args))
            time.sleep(0.5)
            total = _instructions(tmp)
            if args.keep:
                for path in glob.glob(f"{tmp}/cg.*.1"):
                    shutil.copy(path, args.keep)
        finally:
            proc.terminate()
            proc.wait()
    print(
        json.dumps(
            {
                "tree": args.tree,
                "batch": args.batch,
                "inflight": args.inflight,
                "requests": done,
                "instructions_per_request": round(total / done) if done else None,
                "instructions_per_call": round(total / args.rounds),
            }
        )
    )


if __name__ == "__main__":
    main()
