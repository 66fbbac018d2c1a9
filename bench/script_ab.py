"""A/B of the sync script's cost inside Redis: this tree's ``sync.lua`` against another
checkout's, called alternately batch by batch on one redis-server (enqueue 500, then lease
500 and ack the previous 500), each call timed by the server's own CPU time (``INFO cpu``).
Alternating call by call is what makes the comparison hold on a loaded machine: both
scripts see the same load. Prints the median Redis CPU microseconds per request of each.

    git worktree add /tmp/old main
    python bench/script_ab.py --old /tmp/old --redis-port 6399 --batches 100
"""

from __future__ import annotations

import argparse
import hashlib
import json
import secrets
import statistics
import subprocess
import sys
from typing import Any

import redis

from scrapy_ha.keys import Keys
from scrapy_ha.store import script_keys
from scrapy_ha.store.scripts import SYNC_LUA

BATCH = 500
#: The worker nonce of the numbered requests.
NONCE = secrets.token_hex(8).encode()
#: The old tree's script, as that tree assembles it (run from outside this tree).
OLD_SCRIPT = "from scrapy_ha.store.scripts import SYNC_LUA; print(SYNC_LUA, end='')"


def old_sync(tree: str) -> str:
    env = {"PYTHONPATH": tree}
    args = [sys.executable, "-c", OLD_SCRIPT]
    return subprocess.run(args, env=env, cwd=tree, capture_output=True, text=True).stdout


def sync_keys(k: Keys, n_keys: int) -> list[str]:
    """The first *n_keys* keys sync.lua takes (an older script takes fewer; one with back
    queues takes their prefix first and ready, waiting and queued last)."""
    if n_keys == 24:
        return script_keys.sync_keys(k)
    every = [k.legacy_pending, k.payload, k.dupefilter, k.seq, k.leased, k.leases, k.expiries]
    every += [k.delayed, k.delayed_score, k.lease_seq, k.gates, k.dead, k.dead_info]
    every += [*script_keys.stats_keys(k), k.retried, k.paused, k.sent, k.domain_limits]
    every += [k.polite]
    return every[:n_keys]


def layout(text: str) -> tuple[int, bytes]:
    """The keys a version of sync.lua takes and the fields of a request before its
    fingerprint length, as that version reads them (``-`` parent, taken, worker number,
    then the host for back queues)."""
    if "KEYS[22] ready" in text:
        return 24, b"- - %s books.example"
    if "KEYS[20] limits" in text:
        return 21, b"- - %s"
    if "KEYS[19] sent" in text:
        return 19, b"- - %s"
    if "<taken>" in text:
        return 18, b"- -"
    return (13 if "stats" not in text else 17), b"-"


def packed(site: str, i: int, fields: bytes) -> bytes:
    url = f"{site}/item/{i}"
    payload = json.dumps({"v": 1, "u": url, "cb": "parse_item"}, separators=(",", ":"))
    if b"%s" in fields:  # numbered as a worker numbers the children it sends
        fields = fields.replace(b"%s", b"%s.%d" % (NONCE, i + 1))
    fp = hashlib.sha1(url.encode()).digest()[:12]  # noqa: S324
    return b"0 " + fields + b" 12" + fp + payload.encode()


class Variant:
    """One script, its own crawl's keys, and the acks it owes."""

    def __init__(self, client: redis.Redis, name: str, text: str) -> None:
        self.client = client
        self.script = client.register_script(text)
        n_keys, self.fields = layout(text)
        # fields per lease in the reply: a wait (per-domain rate) came with the domain limits,
        # the score with the pending head (a 14th header field)
        scored = "WITHSCORES')[2]" in text
        self.per_lease = 6 if scored or n_keys >= 24 else 5 if n_keys >= 21 else 4
        # leases given back (ARGV[9]) came with a 15th header field, how many were
        given_back = "ARGV[9]" in text
        self.header = 15 if given_back else 14 if scored else 13
        # the arguments after the nonce: the order, then (since the failover fence) expect,
        # then the number of leases given back
        self.head = ["fifo", "-"] if "ARGV[8]" in text else ["fifo"]
        if given_back:
            self.head.append("0")
        self.keys = sync_keys(Keys("ab", name), n_keys)
        self.acks: list[str] = []
        self.costs: list[float] = []

    def _cpu(self) -> float:
        info = self.client.info("cpu")
        return float(info["used_cpu_user"] + info["used_cpu_sys"]) * 1e6

    def _call(self, args: list[Any]) -> tuple[float, list[Any]]:
        before = self._cpu()
        reply = self.script(keys=self.keys, args=args)
        return self._cpu() - before, reply

    def round(self, site: str, first: int) -> None:
        requests = [packed(site, first + i, self.fields) for i in range(BATCH)]
        t1, _ = self._call(
            [len(requests), 0, 0, 30000, 500, secrets.token_hex(6), *self.head, *requests]
        )
        t2, reply = self._call(
            [0, len(self.acks), BATCH, 30000, 500, secrets.token_hex(6), *self.head, *self.acks]
        )
        first = self.header + 2 * int(reply[11]) + int(reply[12])
        self.acks = [
            f"{reply[i].decode()} {reply[i + 1].decode()}"
            for i in range(first, len(reply), self.per_lease)
        ]
        self.costs.append((t1 + t2) / len(requests))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="a checkout of the version to compare with")
    parser.add_argument("--redis-port", type=int, required=True)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--site", default="http://books.example")
    args = parser.parse_args()
    client = redis.Redis(port=args.redis_port)
    client.flushall()
    variants = [Variant(client, "old", old_sync(args.old)), Variant(client, "new", SYNC_LUA)]
    for b in range(args.batches):
        for v in variants if b % 2 else variants[::-1]:
            v.round(args.site, b * BATCH)
    medians = [statistics.median(v.costs[1:]) for v in variants]
    print(
        json.dumps(
            {
                "old_us_per_request": round(medians[0], 2),
                "new_us_per_request": round(medians[1], 2),
                "new_over_old": round(medians[1] / medians[0], 3),
            }
        )
    )


if __name__ == "__main__":
    main()
