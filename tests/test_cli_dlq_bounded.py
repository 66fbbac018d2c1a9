"""The bulk dead-letter and delayed commands on a large selection hold a batch, not the
whole of it (a QA run: 100,000 dead letters cost ``dlq list``, ``export``, ``requeue
--all`` and ``purge --all`` about 200-290 MB and printed nothing until the end;
``delayed retry-now --all`` read a continuous crawl's million revisits into memory).

Each command runs in this process under tracemalloc, on a queue and on one three times as
large: what it holds at its peak must not grow with the selection. What a prompt approved
is what is acted on: entries dead-lettered while it waits stay.
"""

from __future__ import annotations

import contextlib
import io
import os
import pty
import subprocess
import threading
import time
import tracemalloc
from dataclasses import replace
from typing import Any

import pytest
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.cli.bulk import Progress
from scrapy_ha.cli.cmdline import main
from scrapy_ha.deadletters.dlq import SCAN_BATCH
from scrapy_ha.deadletters.stream import Selection
from scrapy_ha.ops.shards import dead_letters as crawl_dead_letters
from tests.cli_seed import ROOT, SCRAPY_HA, dead_letters, delayed
from tests.test_shards import entry, lease_all, sharded

#: Entries of the small queue (the large one has three times as many): two batches or more,
#: as a command holds at most (the one it reads, the one it prints or acts on).
SMALL = 1000


class _Discard(io.TextIOBase):
    """stdout that keeps nothing (a listing kept in memory would be counted)."""

    def write(self, text: str) -> int:
        return len(text)


def _peak(*argv: str) -> tuple[int, int]:
    """The exit code of the command *argv*, and the most memory it held at once (bytes)."""
    result: list[int] = []
    with contextlib.redirect_stdout(_Discard()), contextlib.redirect_stderr(_Discard()):
        tracemalloc.start()
        try:
            thread = threading.Thread(target=lambda: result.append(main(list(argv))))
            thread.start()
            thread.join()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    return result[0], peak


def _dead(url: str, spider: str, n: int, start: int = 0) -> None:
    classes = ("server", "gone", "banned")
    rows = [
        (f"http://a{i % 7}.example/p/{i}?q={'x' * 200}", classes[i % 3], 500)
        for i in range(start, start + n)
    ]
    dead_letters(url, spider, rows)


def _delayed(url: str, spider: str, n: int) -> None:
    rows = [
        (f"http://a{i % 7}.example/p/{i}?q={'x' * 200}", 3600_000 + i, "server") for i in range(n)
    ]
    delayed(url, spider, rows)


COMMANDS = {
    "list": ("dlq", "list"),
    "export": ("dlq", "export"),
    "requeue": ("dlq", "requeue", "--all", "--yes"),
    "purge": ("dlq", "purge", "--all", "--yes"),
    "purge-class": ("dlq", "purge", "--class", "gone", "--yes"),
    "dry-run": ("dlq", "requeue", "--all", "--dry-run"),
    "retry-now": ("delayed", "retry-now", "--all", "--yes"),
    "retry-now-class": ("delayed", "retry-now", "--class", "server", "--yes"),
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_bulk_command_holds_a_batch_not_the_selection(redis_url, redis_client, name):
    group, command, *options = COMMANDS[name]
    fill = _delayed if group == "delayed" else _dead
    for spider, n in (("warm", 10), ("small", SMALL), ("large", 3 * SMALL)):
        fill(redis_url, spider, n)
    run = [group, command]
    _peak(*run, "warm", *options, "--redis-url", redis_url)  # (imports, scripts loaded)
    small = _peak(*run, "small", *options, "--redis-url", redis_url)
    large = _peak(*run, "large", *options, "--redis-url", redis_url)
    assert small[0] == large[0] == 0
    # three times the entries: before, about three times the memory (2 kB an entry)
    assert large[1] < 1.5 * small[1], (small[1], large[1])
    if "--all" in options and "--yes" in options and group == "dlq":
        assert redis_client.zcard("ha:{large}:dead") == 0  # every one acted on


def _prompted(argv: list[str], url: str, meanwhile: Any) -> str:
    """Run ``scrapy-ha *argv`` on a terminal, call *meanwhile* at its prompt, answer yes;
    what it printed."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(  # noqa: S603 - the project's own console script
        [SCRAPY_HA, *argv, "--redis-url", url],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        cwd=ROOT,
    )
    os.close(follower)
    said = b""
    try:
        deadline = time.monotonic() + 60
        while b"[y/N]" not in said and time.monotonic() < deadline:
            said += os.read(leader, 4096)
        assert b"[y/N]" in said, said
        meanwhile()
        os.write(leader, b"y\n")
        while proc.poll() is None or said.count(b"\n") < 2:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal closed with the process
                break
            if not chunk:
                break
            said += chunk
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(leader)
    return said.decode(errors="replace")


def test_what_the_prompt_approved_is_what_is_requeued(redis_url, redis_client):
    _dead(redis_url, "books", 700)
    said = _prompted(
        ["dlq", "requeue", "books", "--all"],
        redis_url,
        lambda: _dead(redis_url, "books", 5, start=700),  # dead-lettered while the prompt waits
    )
    assert "requeue 700 entries of books? [y/N]" in said
    assert "requeued 700 of 700 entries" in said, said
    assert redis_client.zcard("ha:{books}:dead") == 5  # the newcomers stay


def test_a_purge_frees_a_redis_that_is_full(redis_url, redis_client):
    """A purge is how an operator frees a Redis at its ``maxmemory`` (``noeviction``: it
    refuses every write but deletes): the command writes nothing before it deletes (a
    review: it wrote the approved ids to a Redis list first, and failed with
    OutOfMemoryError, a traceback, every dead letter kept)."""
    _dead(redis_url, "books", 700)
    used = int(redis_client.info("memory")["used_memory"])
    redis_client.config_set("maxmemory-policy", "noeviction")
    redis_client.config_set("maxmemory", used - 1024)
    try:
        done = subprocess.run(  # noqa: S603 - the project's own console script
            [SCRAPY_HA, "dlq", "purge", "books", "--all", "--yes", "--redis-url", redis_url],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
            check=False,
        )
    finally:
        redis_client.config_set("maxmemory", 0)
    assert done.returncode == 0, done.stderr
    assert "purged 700 of 700 entries" in done.stdout, done.stdout
    assert redis_client.zcard("ha:{books}:dead") == 0


def test_the_approved_delayed_requests_alone_are_made_due(redis_url, redis_client):
    _delayed(redis_url, "books", 1100)
    later = []

    def meanwhile() -> None:
        later.extend(delayed(redis_url, "books", [("http://late.example/", 3600_000, "server")]))

    said = _prompted(["delayed", "retry-now", "books", "--all"], redis_url, meanwhile)
    assert "retry now 1,100 delayed requests of books? [y/N]" in said
    assert "made 1,100 of 1,100 delayed requests of books due now" in said, said
    due = redis_client.zscore("ha:{books}:delayed", later[0])
    assert due is not None and due > time.time() * 1000 + 3000_000  # still an hour away


@deferred_f_from_coro_f
async def test_every_shard_s_dead_letters_come_merged_oldest_first_a_batch_at_a_time(redis_url):
    """As one sort of every shard's entries put them (the lower shard first at a tie),
    pages too, read a batch at a time."""
    q = sharded(redis_url, shards=3)
    await q.sync(enqueue=[entry(f"u{i}") for i in range(1100)])
    for x in await lease_all(q):
        await q.dead_letter(x.id, x.token, {"class": "server", "reason": "HTTP 500"})
    dlq = crawl_dead_letters(q)
    whole = [
        replace(e, id=q.outside(i, e.id))
        for i, part in enumerate(dlq.parts)
        async for e in part.scan()
    ]
    whole.sort(key=lambda e: e.dead_at)
    batches = [b async for b in dlq.batches(Selection())]
    assert max(len(b) for b in batches) == SCAN_BATCH
    assert [e.id for b in batches for e in b] == [e.id for e in whole]
    page = await dlq.entries(offset=300, limit=600)
    assert [e.id for e in page] == [e.id for e in whole[300:900]]
    assert len({q.route(e.id)[0] for e in page}) == 3
    assert await dlq.requeue([e.id async for e in dlq.scan(skip=1000)]) == 100
    assert await dlq.count() == 1000
    await q.client.aclose()


def test_a_long_action_says_how_far_it_went_on_a_terminal_alone():
    leader, follower = pty.openpty()
    with open(follower, "w", closefd=True) as tty:
        progress = Progress("requeue:", 100_000, stream=tty, every=0.05)
        progress.step(500)  # (not yet: every 0.05 s)
        time.sleep(0.06)
        progress.step(1000)
    assert os.read(leader, 4096) == b"requeue: 1,000 of 100,000 ...\r\n"
    os.close(leader)
    log = io.StringIO()  # a script's stderr: the final count alone
    quiet = Progress("requeue:", 100_000, stream=log, every=0.05)
    time.sleep(0.06)
    quiet.step(1000)
    assert log.getvalue() == ""


@deferred_f_from_coro_f
async def test_entries_that_leave_meanwhile_shift_no_other_out_of_a_scan(redis_url):
    """A scan reads a batch at a time by rank; the oldest dead letters leave meanwhile (the
    queue at its cap, a requeue by another command): every later entry moved up past the
    next batch's first rank, and as many as left were never read (as in ``delayed``'s)."""
    from scrapy_ha.deadletters.dlq import DeadLetterQueue
    from scrapy_ha.keys import Keys
    from scrapy_ha.store.queue import RedisQueue

    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), Keys("ha", "left"))
    n = 2 * SCAN_BATCH + 200
    await q.sync(enqueue=[entry(f"u{i}") for i in range(n)])
    for x in await lease_all(q):  # (the entries of a batch share their time: ties)
        await q.dead_letter(x.id, x.token, {"class": "server", "reason": "HTTP 500"})
    read, left = [], []
    async for e in DeadLetterQueue(q).scan():
        read.append(e.id)
        if len(read) == SCAN_BATCH - 1:  # the last of the batch and 99 before it leave
            left = [m for m, _ in await q.client.zpopmin(q.keys.dead, 100)]
            gone = await q.client.zrange(q.keys.dead, SCAN_BATCH - 101, SCAN_BATCH - 101)
            await q.client.zrem(q.keys.dead, *gone)
    assert len(left) == 100
    assert len(read) == len(set(read)) == n  # each read once, none shifted out
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_counting_a_large_selection_says_how_far_it_went_on_a_terminal():
    """The count before a bulk action's prompt reads the whole selection (a minute for a
    million entries): it said nothing meanwhile, as if the command hung."""
    from scrapy_ha.cli.bulk import choose

    async def batches():
        for i in range(3):
            yield [(f"id{i}-{j}", f"label {i}-{j}") for j in range(500)]

    leader, follower = pty.openpty()
    with open(follower, "w", closefd=True) as tty:
        every = Progress("counted:", None, stream=tty, every=1e-9)  # a line a batch
        chosen = await choose(batches(), None, every)
    said = b""
    while said.count(b"\n") < 3:
        said += os.read(leader, 4096)
    os.close(leader)
    assert chosen.count == 1500
    assert said.decode().splitlines() == [
        "counted: 500 so far ...",
        "counted: 1,000 so far ...",
        "counted: 1,500 so far ...",
    ]
