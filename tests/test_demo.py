"""The README's run command, small: three workers, one SIGKILLed, faults, a proxy, a report."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from typing import TYPE_CHECKING

from scrapy_ha.demo import harness
from scrapy_ha.demo import run as demo_run
from scrapy_ha.demo.run import GONE_EVERY
from scrapy_ha.keys import Keys
from scrapy_ha.store.renew_wire import renew_args
from scrapy_ha.store.scripts import Registered

if TYPE_CHECKING:
    from pathlib import Path

    import redis

PAGES, PER_PAGE = 60, 20
#: What the SIGKILLed worker can make the others redo: its prefetch buffer (16), its
#: unfinished requests (2 x 16) and one round of acks (16), as in the crash tests.
TWICE_BOUND = 4 * 16


def run_demo(tmp_path: Path, timeout: float = 300) -> tuple[int, str]:
    """The demo as a user runs it; stopped with everything it started if it overruns."""
    log = tmp_path / "demo.out"
    with log.open("wb") as out:
        proc = harness.spawn(
            [
                sys.executable,
                "-m",
                "scrapy_ha.demo.run",
                "--pages",
                str(PAGES),
                "--per-page",
                str(PER_PAGE),
                "--dir",
                str(tmp_path / "demo"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        code = proc.wait(timeout)
    finally:
        harness.stop(proc)
    return code, log.read_text(errors="replace")


def row(out: str, label: str) -> int:
    match = re.search(rf"^  {re.escape(label)}\s+(\d+)$", out, re.MULTILINE)
    assert match, f"no row {label!r} in the report:\n{out}"
    return int(match.group(1))


def test_the_demo_reports_nothing_lost(tmp_path: Path) -> None:
    code, out = run_demo(tmp_path)
    assert code == 0, out[-3000:]
    assert "OK: nothing was lost" in out
    assert "SIGKILLed worker 1" in out
    total = PAGES * PER_PAGE
    gone = total // GONE_EVERY
    assert row(out, "items expected (404s excluded)") == total - gone
    assert row(out, "unique items") == total - gone
    assert row(out, "items lost") == 0
    assert row(out, "gone (404) items dead-lettered as gone") == gone
    assert row(out, "items stored twice") <= TWICE_BOUND
    assert row(out, "leases reclaimed (worker 1's)") > 0  # the kill happened mid-crawl
    assert "proxy password in any log             no" in out


def _renew(client: redis.Redis, worker: str, pairs: list[tuple[str, str]]) -> None:
    """One renew.lua call of *worker* with the demo's lease time; returns once Redis's clock
    is past its millisecond (a count from then on sees it as done before)."""
    args = renew_args(
        pairs, pairs, worker=worker, lease_ms=5000, heartbeat_ms=5000, stats='{"leases": 1}'
    )
    reply = Registered(client, "renew")(keys=Keys("ha", "catalogue").renew_keys(), args=args)
    while _ms(client) <= int(reply[0]):
        pass


def _ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_the_kill_counts_the_leases_redis_still_holds_for_the_worker(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """The demo kills worker 1 only when Redis holds leases for it: a count it published
    earlier may be leases all acked since, and the kill then reclaims nothing (the report's
    'leases reclaimed' row was 0 once in CI). First those of its latest round (its grant)
    still under the same token."""
    keys = Keys("ha", "catalogue")
    grant = keys.grant("host:4242:job:ab12")
    redis_client.hset(grant, mapping={"1": "n-7.1", "2": "n-7.2", "3": "n-7.3", "4": "n-7.4"})
    # 1 and 2 still held, 3 acked (no record), 4 reclaimed and leased to another worker
    redis_client.hset(
        keys.leases, mapping={"1": "n-7.1 5 example.com", "2": "n-7.2 5 -", "4": "m-9.1 5 -"}
    )
    redis_client.hset(keys.grant("host:4243:cd34"), mapping={"5": "n-8.1"})
    redis_client.hset(keys.leases, "5", "n-8.1 5 -")
    assert demo_run._granted_to(redis_url, 4242) == 2
    assert demo_run._granted_to(redis_url, 4243) == 1
    assert demo_run._granted_to(redis_url, 4244) == 0
    redis_client.hdel(keys.leases, "1", "2")
    assert demo_run._granted_to(redis_url, 4242) == 0


def test_without_a_grant_the_kill_counts_the_leases_nobody_renews(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """A round that leases nothing deletes the grant (in CI worker 1 showed none for the
    whole crawl, and the demo timed out): then the leases nobody renews while worker 1 is
    stopped are its own. (The count of the leases its latest renewal gave an expiry, tried
    first, also took in those another worker leased in the same millisecond.)"""
    keys = Keys("ha", "catalogue")
    records = {"1": "n-7.1 5 -", "2": "n-7.2 5 -", "5": "n-8.1 5 -"}
    redis_client.hset(keys.leases, mapping=records)
    redis_client.zadd(keys.leased, {i: 0 for i in records})
    _renew(redis_client, "host:4242:ab12", [("1", "n-7.1"), ("2", "n-7.2")])  # then stopped
    _renew(redis_client, "host:4243:cd34", [("5", "n-8.1")])
    assert demo_run._unrenewed(redis_url, lambda: None) == 3  # the other renewed nothing
    # the other renews its lease while the first is stopped
    renewing = functools.partial(_renew, redis_client, "host:4243:cd34", [("5", "n-8.1")])
    assert demo_run._unrenewed(redis_url, renewing) == 2
    redis_client.zrem(keys.leased, "1", "2")  # acked
    assert demo_run._unrenewed(redis_url, lambda: None) == 1  # the other's, not renewed since
    assert demo_run._unrenewed(redis_url, renewing) == 0
