"""The item-outbox scenario of the chaos suite: every item exactly once in every sink.

Three workers with ``HA_ITEMS = "outbox"`` crawl the catalogue while 8 of them, picked at
random, are SIGKILLed at random moments and started again, and one is frozen (SIGSTOP) until
every lease it held has expired and moved on, then resumed (SIGCONT): its late acks, and
the items they carry, must be refused. Two sinks read the item stream meanwhile: a JSON
Lines file (one consumer) and an SQL table (two consumers sharing the work), one of whose
consumers is SIGKILLed twice while it holds a batch (delivered, not acknowledged) and started
again under its name. The tally: every item of the site exactly once in the file, in the
table and in the stream's count of committed items. The worker's own pipeline (an
unbuffered JSON Lines append, run before the outbox) is counted too: its duplicates are
what the items would have been without the outbox.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import redis

from scrapy_ha.demo import harness

if TYPE_CHECKING:
    from chaos.run import Cluster

#: Worker SIGKILLs of the full scenario (the short one, in `make test`, has 3).
KILLS = 8
#: SIGKILLs of an SQL consumer holding a batch.
SINK_KILLS = 2
#: Entries per consumer read: small, so that a kill lands mid-batch and batches are many.
BATCH = 50
GROUP_SQL, GROUP_JSONL = "sql", "jsonl"
#: The workers' settings beyond the suite's. SCHEDULER_PERSIST: a worker restarted after the
#: crawl finished (a fault timed after its end: the short crawl can end before the faults
#: do) finds every request seen and crawls nothing; cleared, it would start the crawl again
#: and commit every item a second time, a new crawl's, not a duplicate of the outbox.
WORKER_EXTRA = {"HA_ITEMS": "outbox", "SCHEDULER_PERSIST": "True"}


class Sinks:
    """The consumers of the crawl's item stream: a JSON Lines file, an SQL table (two
    consumers), each started with ``scrapy-ha items`` and restarted under its name."""

    def __init__(self, c: Cluster, sql_url: str | None = None) -> None:
        self.c = c
        self.jsonl = c.dir / "sink.jl"
        self.sql_url = sql_url or f"sqlite:///{c.dir / 'sink.db'}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.hits = 0  # consumer kills that landed while it held a batch
        self.missed = 0  # consumer kills that landed just after it acknowledged its batch
        #: per consumer, what it held when it was killed (its next run finishes those first)
        self.left: dict[str, set[bytes]] = {"sql-a": set(), "sql-b": set()}

    def start(self, name: str) -> None:
        to, group = (
            (f"jsonl:{self.jsonl}", GROUP_JSONL) if name == "jl" else (self.sql_url, GROUP_SQL)
        )
        args = [sys.executable, "-m", "scrapy_ha.cli.cmdline", "items", "chaos", "--create"]
        args += ["--to", to]
        args += ["--redis-url", self.c.redis_url, "--group", group, "--consumer", name]
        args += ["--batch", str(BATCH), "--claim-idle", "5", "--exit-idle", "3"]
        with (self.c.dir / f"sink-{name}.log").open("ab") as out:
            proc = harness.spawn(
                args, cwd=self.c.dir, stdout=out, stderr=subprocess.STDOUT, env=self.c.env()
            )
        self.procs[name] = proc
        self.c.procs.append(proc)

    def declare(self) -> None:
        """Both groups exist before the first item: neither sink misses one."""
        for name in ("jl", "sql-a", "sql-b"):
            self.start(name)

    def kill_mid_batch(self, timeout: float = 60) -> None:
        """SIGKILL the first SQL consumer seen holding a batch of its own (not one a killed
        consumer of its name left it, which it finishes first), then start it again. A kill
        that lands just after the consumer acknowledged its batch (it held nothing when it
        died) is counted in `missed` and another is made, until one lands mid-batch."""
        client = redis.Redis.from_url(self.c.redis_url)
        try:
            while not self._kill_once(client, timeout):
                self.missed += 1
        finally:
            client.close()

    def _kill_once(self, client: redis.Redis, timeout: float) -> bool:
        """One SIGKILL of a consumer seen holding a batch; whether it died holding one."""

        def holding() -> str | None:
            return next(
                (n for n in ("sql-a", "sql-b") if _pending(client, GROUP_SQL, n) - self.left[n]),
                None,
            )

        name = harness.wait_for(holding, "an SQL consumer holding a batch", timeout, 0.002)
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.left[name] = _pending(client, GROUP_SQL, name)
        self.start(name)
        hit = bool(self.left[name])  # it died holding entries not acknowledged
        self.hits += hit
        return hit

    def wait(self, timeout: float = 300) -> None:
        """The consumers exit once the crawl has ended and every item is in their sink."""
        for name, proc in self.procs.items():
            code = proc.wait(timeout=timeout)
            if code != 0:
                raise RuntimeError(f"consumer {name} exited with {code}: see its log")

    def sql_ids(self) -> list[int]:
        if self.sql_url.startswith("sqlite:///"):
            # closing(): a connection's own `with` ends a transaction and leaves it open
            with contextlib.closing(sqlite3.connect(self.sql_url[len("sqlite:///") :])) as db:
                rows = db.execute("SELECT item FROM scrapy_ha_items").fetchall()
            return [json.loads(r[0])["id"] for r in rows]
        import sqlalchemy

        engine = sqlalchemy.create_engine(self.sql_url)
        with engine.connect() as conn:
            rows = conn.execute(sqlalchemy.text("SELECT item FROM scrapy_ha_items")).all()
        engine.dispose()
        return [(json.loads(r[0]) if isinstance(r[0], str) else r[0])["id"] for r in rows]

    def jsonl_ids(self) -> list[int]:
        return [json.loads(line)["id"] for line in self.jsonl.read_text().splitlines()]


def _pending(client: redis.Redis, group: str, consumer: str) -> set[bytes]:
    """The entries *consumer* was delivered and has not acknowledged."""
    try:
        rows = client.xpending_range(
            "ha:{chaos}:items", group, "-", "+", 10_000, consumername=consumer
        )
    except redis.exceptions.ResponseError:  # the group is not there yet
        return set()
    return {row["message_id"] for row in rows}


def _tally(c: Cluster, sinks: Sinks, faults: int) -> dict[str, Any]:
    expected = set(range(1, c.pages * c.per_page + 1))
    client = redis.Redis(port=c.redis_port)
    committed = int(client.hget("ha:{chaos}:stats", "items") or 0)
    refused = int(client.hget("ha:{chaos}:stats", "items_refused") or 0)
    in_stream = int(client.xlen("ha:{chaos}:items"))
    client.close()
    out: dict[str, Any] = {"expected": len(expected), "committed": committed}
    for name, ids in (("jsonl", sinks.jsonl_ids()), ("sql", sinks.sql_ids())):
        counts = Counter(ids)
        out[f"{name}_lost"] = len(expected - set(counts))
        out[f"{name}_twice"] = sum(1 for n in counts.values() if n > 1)
    worker_file = Counter(json.loads(line)["id"] for line in c.items.read_text().splitlines())
    return {
        **out,
        "lost": out["jsonl_lost"] + out["sql_lost"],
        "twice": out["jsonl_twice"] + out["sql_twice"],
        "bound": 0,
        "refused_items": refused,
        "left_in_stream": in_stream,
        "sink_kills_mid_batch": sinks.hits,
        "sink_kills_missed": sinks.missed,
        "worker_pipeline_twice": sum(1 for n in worker_file.values() if n > 1),
        "reclaimed": c.stat("ha/reclaimed"),
        "stale_acks": c.stat("ha/stale_acks"),
        "sql": "sqlite" if sinks.sql_url.startswith("sqlite") else sinks.sql_url.split(":")[0],
        "faults": faults + sinks.missed,
        "elapsed": round(time.monotonic() - c.started, 1),
        "ok_extra": committed == len(expected) and in_stream == 0,
    }


def items(c: Cluster, short: bool, sql_url: str | None = None) -> dict[str, Any]:
    """Workers SIGKILLed and one frozen past its leases, an SQL consumer SIGKILLed mid-batch:
    every item once in each sink."""
    # 10,000 items in the full run; 2,000 in the short one (not the other scenarios' 1,000:
    # its faults, two sink kills, a worker kill and a freeze, each need the crawl still
    # running, and 1,000 items were sometimes all crawled before the freeze found a busy
    # worker)
    c.pages = 100 if short else 500
    c.extra = dict(WORKER_EXTRA)
    c.start_redis()
    c.start_site()
    sinks = Sinks(c, sql_url)
    sinks.declare()
    for n in range(3):
        c.start_worker(n)
    rng = random.Random()
    kills = 3 if short else KILLS
    # Both need a crawl that runs (a batch in flight, a worker with leases): the short crawl
    # can end before faults at random moments do, so its sink kills come first, then the
    # freeze.
    sink_kills = [0] * SINK_KILLS if short else sorted(rng.sample(range(kills), SINK_KILLS))
    frozen_at = 1 if short else rng.randrange(kills)
    total = c.pages * c.per_page
    c.wait_items(min(50, total // 10))
    for i in range(kills + 1):
        if i == frozen_at:
            _freeze(c)
        for _ in range(sink_kills.count(i)):
            sinks.kill_mid_batch()
        if i < kills:
            time.sleep(rng.uniform(0.5, 3.0))
            n = rng.randrange(3)
            c.workers[n].send_signal(signal.SIGKILL)
            c.workers[n].wait()
            c.start_worker(n)
    c.wait_workers(timeout=1800)
    sinks.wait()
    return _tally(c, sinks, faults=kills + 1 + SINK_KILLS)


def _busy_worker(c: Cluster, client: redis.Redis, least: int = 4) -> str | None:
    """A worker that held *least* leases at its last renewal (its pages in flight, their
    items in its outbox), by the pid in its worker id: its number as text (``"0"`` is
    true, as `wait_for` needs)."""
    for worker, value in client.hgetall("ha:{chaos}:wstats").items():
        pid = worker.decode().split(":")[1]
        leases = json.loads(value.decode().partition(" ")[2] or "{}").get("leases", 0)
        for n, proc in c.workers.items():
            if str(proc.pid) == pid and proc.poll() is None and leases >= least:
                return str(n)
    return None


def _freeze(c: Cluster) -> None:
    """SIGSTOP a busy worker until every lease it may hold has expired and moved on: what it
    had in flight is redone by the others, and its late acks, with their items, refused."""
    from chaos.run import _all_moved_on, _leases

    client = redis.Redis(port=c.redis_port)
    n = int(harness.wait_for(lambda: _busy_worker(c, client), "a busy worker", 60, 0.05))
    c.workers[n].send_signal(signal.SIGSTOP)
    held = _leases(client)
    harness.wait_for(lambda: _all_moved_on(client, held), "the frozen worker's leases", 120)
    c.workers[n].send_signal(signal.SIGCONT)
    client.close()
