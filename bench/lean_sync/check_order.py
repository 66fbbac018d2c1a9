"""Checks ``lean.lua``'s lease order, reclaim and fencing on a plain redis-server: requests
enqueued in uneven runs per host at three priorities and leased in batches come out in id
order (priority first, then FIFO), none lost or given twice; an expired lease is
reclaimed and leased again, and its stale ack stores no child; a child of a lease held but
not acked in the call is stored, one of a lease never made is refused.

    python bench/lean_sync/check_order.py [--opts O]
"""

from __future__ import annotations

import argparse
import hashlib
import random
import subprocess
import time
from pathlib import Path
from typing import Any

import redis
from drive import KEYS, _free_port  # (run from anywhere: python puts this folder first)

HERE = Path(__file__).resolve().parent


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--opts", default="O")
    opts = p.parse_args().opts
    port = _free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        r = redis.Redis(port=port)
        for _ in range(100):
            try:
                r.ping()
                break
            except redis.exceptions.ConnectionError:
                time.sleep(0.1)
        r.function_load((HERE / "lean.lua").read_text(), replace=True)
        _check(r, opts)
        r.close()
    finally:
        proc.terminate()
        proc.wait()
    print("ok")


def _sync(
    r: redis.Redis,
    reqs: list,
    acks: tuple = (),
    lease: int = 0,
    lease_ms: int = 3_600_000,
    opts: str = "",
) -> Any:
    at = {a: f"{i:03d}" for i, a in enumerate(acks, 1)}
    reqs = [(*c[:3], at.get(c[3], c[3])) for c in reqs]
    reqs = sorted(((*c, f"{k:03d}") for k, c in enumerate(reqs, 1)), key=lambda c: (c[0], c[1]))
    args: list[Any] = [len(reqs), len(acks), lease, lease_ms, "w", opts, *acks]
    args += [c[3] for c in reqs] + [c[2] for c in reqs]
    args += [f"{{c}}:q:{c[0]}:{c[1]}" for c in reqs] + [c[0] for c in reqs]
    args += [f"{c[4]} {c[1]} p".encode() for c in reqs]
    return r.fcall("proto3_sync", 6, *KEYS, *args)


def _check(r: redis.Redis, opts: str) -> None:
    rnd = random.Random(7)
    total = 0
    for _ in range(30):
        reqs = []
        for _ in range(rnd.randint(1, 40)):
            host = f"h{rnd.choice([0, 0, 0, 1, 2, 3])}"
            code = rnd.choice(["500", "500", "499", "501"])  # priority 0, 1, -1
            total += 1
            reqs.append((code, host, hashlib.sha1(str(total).encode()).digest()[:12], "-"))  # noqa: S324
        _sync(r, reqs)
    got: list[str] = []
    while ids := [e[:15].decode() for e in _sync(r, [], lease=rnd.randint(1, 13), opts=opts)[6:]]:
        assert ids == sorted(ids), ids
        got += ids
    assert len(got) == total == len(set(got)), (len(got), total)
    assert got == sorted(got), "priority, then FIFO"
    print("order ok:", total, "requests")
    # reclaim: 2 leases of 1 ms reclaimed; the stale ack stores no child
    _sync(r, [("500", "h9", b"a" * 12, "-"), ("500", "h9", b"b" * 12, "-")])
    prefix = _sync(r, [], lease=2, lease_ms=1)[5].decode()
    time.sleep(0.01)
    assert r.fcall("proto3_reclaim", 6, *KEYS, int(time.time() * 1000), 10) == 2
    token = prefix + "001"
    reply = _sync(r, [("500", "h9", b"c" * 12, token)], acks=(token,), lease=2)
    assert reply[0] == 0 and reply[2] == 1 and len(reply[6:]) == 2, reply[:6]
    # a parent held, not acked in the call: its child is stored; a lease never made: refused
    token = _sync(r, [("500", "h8", b"d" * 12, "-")], lease=1)[5].decode() + "001"
    reply = _sync(r, [("500", "h8", b"e" * 12, token), ("500", "h8", b"f" * 12, "zzzz.999")])
    assert reply[1] == 1 and reply[2] == 1, reply[:6]


if __name__ == "__main__":
    main()
