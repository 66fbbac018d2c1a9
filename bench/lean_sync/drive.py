"""What a redesigned sync script would cost Redis: ``lean.lua`` (a prototype, not wired into
scrapy-ha) driven with ``bench/script_cost.py``'s workload under valgrind's callgrind.

20,000 requests over 50 sites are queued first and ``--inflight`` leases held; then each
round stores one child per page finished (fenced by that page's lease), acks those pages
and leases ``--batch`` more, in one ``FCALL``. The server's instructions are counted after
30 warm-up rounds and divided by the requests acked, as ``bench/script_cost.py`` counts
the real script's (docs/benchmarks.md, "A redesign of the sync script, measured"). The
run checks that the pending count equals what the queues hold and that every lease came
out in priority, then FIFO order.

``--opts`` adds features back (letters of ``lean.lua``'s header: ``O`` the lease by LPOP,
``D`` exact per-domain tallies, ``L`` per-domain limits, ``P`` today's request string,
``T`` type checks, ...); ``--fn proto3_empty`` measures the call alone with the same
arguments; ``--plain`` runs without valgrind (a quick check). Needs valgrind.

    python bench/lean_sync/drive.py --batch 10 --opts O
    python bench/lean_sync/drive.py --batch 10 --opts OCdGSMWHEYT
    python bench/lean_sync/drive.py --plain --opts O   # the order checks only
"""

from __future__ import annotations

import argparse
import collections
import glob
import hashlib
import json
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
WARM = 30
FRONTIER = 20_000
LEASE_MS = 3_600_000
TAG = "{c}"
KEYS = [f"{TAG}:{name}" for name in ("seen", "leased", "held", "ready", "stats", "stale")]
SYNC = "proto3_sync"
#: The lease's host of each token, for the per-domain tallies of its ack (opts D, L, d).
HOST_OF: dict[str, str] = {}
#: Every entry id leased, in the order leased: they must come sorted (priority, then FIFO).
ORDER: list[str] = []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child(worker: int, i: int) -> tuple[bytes, str, str]:
    """A request of one of 50 sites: its fingerprint, host and payload."""
    host = f"site-{i % 50}.example"
    url = f"http://{host}/item/{worker}/{i}"
    payload = json.dumps({"v": 1, "u": url, "cb": "parse_item"}, separators=(",", ":"))
    return hashlib.sha1(url.encode()).digest()[:12], host, payload  # noqa: S324


def sync_args(children: list[Any], acks: list[str], n_lease: int, nonce: str, opts: str) -> list:
    """The call's arguments: children ``(fp, host, payload, parent token or '-')`` sorted by
    queue (a parent acked in this call named by its ack's index), then the acks."""
    at = {t: f"{i:03d}" for i, t in enumerate(acks, 1)}
    children = [(*c[:3], at.get(c[3], c[3])) for c in children]
    ordered = sorted(((*c, f"{k:03d}") for k, c in enumerate(children, 1)), key=lambda c: c[1])
    args: list[Any] = [len(ordered), len(acks), n_lease, LEASE_MS, nonce, opts, *acks]
    args += [c[3] for c in ordered]
    args += [c[0] for c in ordered]
    args += [f"{TAG}:q:500:{c[1]}" for c in ordered]
    args += ["500"] * len(ordered)
    args += [f"{c[4]} {c[1]} ".encode() + c[2].encode() for c in ordered]
    if set(opts) & set("DLPd"):
        args += [c[1] for c in ordered]
        args += [HOST_OF[t] for t in acks]
    if "P" in opts:  # today's one string per request (the fields lean.lua reads as columns)
        args += [
            f"0 {c[3]}/x - w0.{k} {c[1]} 12".encode() + c[0] + c[2].encode()
            for k, c in enumerate(ordered)
        ]
    return args


def leased(reply: list) -> tuple[int, int, list[str]]:
    """(acked, added, the tokens of the new leases) of a sync's reply."""
    acked, added, _refused, _filtered, _pending, prefix = reply[:6]
    tokens = []
    for j, element in enumerate(reply[6:], 1):
        ORDER.append(element[:15].decode())
        token = prefix.decode() + f"{j:03d}"
        HOST_OF[token] = element[16:].split(b" ", 1)[0].decode()
        tokens.append(token)
    return acked, added, tokens


def _start(args: argparse.Namespace, tmp: str, port: int) -> subprocess.Popen[bytes]:
    cmd = ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", tmp]
    for item in args.config:
        name, value = item.split("=", 1)
        cmd += ["--" + name, value]
    if not args.plain:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.%p", *cmd]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _prepare(r: redis.Redis, args: argparse.Namespace) -> collections.deque[str]:
    r.function_load((HERE / "lean.lua").read_text(), replace=True)
    # the keys some features read (opts E, Y): present, holding another request's entry
    r.hset(f"{TAG}:stats:expiries", "other", "1 1")
    r.hset(f"{TAG}:stats:retried", "other", "1")
    r.zadd(f"{TAG}:seen:delayed", {"other": 9e15})
    if args.wide:  # the per-domain hashes kept as hash tables (a field of 100 bytes)
        for name in ("domain", "polite"):
            r.hset(f"{TAG}:stats:{name}", "sentinel", "x" * 100)
    for start in range(0, FRONTIER, 500):
        queued = [(*child(-1, i), "-") for i in range(start, start + 500)]
        r.fcall(SYNC, 6, *KEYS, *sync_args(queued, [], 0, "p", ""))
    held: collections.deque[str] = collections.deque()
    if args.inflight:
        held.extend(leased(r.fcall(SYNC, 6, *KEYS, *sync_args([], [], args.inflight, "w0", "")))[2])
    return held


def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = tempfile.mkdtemp(prefix="lean-sync-")
    port = _free_port()
    proc = _start(args, tmp, port)
    try:
        r = redis.Redis(port=port)
        for _ in range(600):
            try:
                r.ping()
                break
            except redis.exceptions.ConnectionError:
                time.sleep(0.1)
        held = _prepare(r, args)
        acks: list[str] = [] if args.fn == SYNC else [held.popleft() for _ in range(args.batch)]
        made = 0

        def rounds(n: int) -> int:
            nonlocal acks, made
            done = 0
            for _ in range(n):
                children = [(*child(0, made + k), a) for k, a in enumerate(acks)]
                made += len(acks)
                reply = r.fcall(
                    args.fn, 6, *KEYS, *sync_args(children, acks, args.batch, "w0", args.opts)
                )
                if args.fn != SYNC:  # the call alone: the same arguments, nothing done
                    done += len(acks)
                    continue
                acked, _added, tokens = leased(reply)
                done += acked
                held.extend(tokens)
                acks = [held.popleft() for _ in range(min(args.batch, len(held) - args.inflight))]
            return done

        rounds(WARM)
        if not args.plain:
            subprocess.run(
                ["callgrind_control", "-z", str(proc.pid)], check=True, capture_output=True
            )
        done = rounds(args.rounds)
        total = 0
        if not args.plain:
            subprocess.run(
                ["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True
            )
            time.sleep(0.5)
            for path in glob.glob(f"{tmp}/cg.*.1"):
                for line in Path(path).read_text().splitlines():
                    if line.startswith("summary:"):
                        total = int(line.split()[1])
        check = {
            "pending": int(r.hget(KEYS[4], "pending") or 0),
            "queued": sum(r.llen(k) for k in r.zrange(KEYS[3], 0, -1) if k.startswith(b"{c}:q:")),
            "held": r.hlen(KEYS[2]),
        }
        r.close()
    finally:
        proc.terminate()
        proc.wait()
        subprocess.run(["rm", "-rf", tmp], check=False)
    return {
        "fn": args.fn,
        "opts": args.opts,
        "batch": args.batch,
        "inflight": args.inflight,
        "requests": done,
        "instructions_per_request": round(total / done) if done and total else None,
        "check": check,
        "lease_order_ok": ORDER == sorted(ORDER) and len(set(ORDER)) == len(ORDER),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--fn", default=SYNC, help="proto3_empty: the call alone")
    p.add_argument("--opts", default="O")
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--inflight", type=int, default=64)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--config", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--wide", action="store_true", help="per-domain hashes never listpacks")
    p.add_argument("--plain", action="store_true", help="no valgrind (a quick check)")
    print(json.dumps(run(p.parse_args())))


if __name__ == "__main__":
    main()
