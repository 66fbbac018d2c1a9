"""Pagination checkpoints: resume a paginated task from its last page, fenced by its lease."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.keys import Keys
from scrapy_ha.store.wire import NewEntry
from tests.test_queue_scripts import open_queue

if TYPE_CHECKING:
    import redis

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = {
    "SCHEDULER": "scrapy_ha.Scheduler",
    "HA_CHECKPOINTS": "True",
    "SPIDER_MIDDLEWARES": '{"scrapy_ha.checkpoint.CheckpointMiddleware": 900}',
    "HA_IDLE_TIMEOUT": "1",
    "LOG_LEVEL": "INFO",
    "CONCURRENT_REQUESTS": "4",
}


def run_paged(
    redis_url: str,
    site_url: str,
    items: Path,
    log: Path,
    spider_file: str = "paged_spider.py",
    **extra: str,
):
    args = [
        sys.executable,
        "-m",
        "scrapy.cmdline",
        "runspider",
        str(ROOT / "tests" / spider_file),
        "-a",
        f"base_url={site_url}",
        "-s",
        f"REDIS_URL={redis_url}",
        "-s",
        f"ITEMS_FILE={items}",
    ]
    for name, value in {**SETTINGS, **extra}.items():
        args += ["-a" if name.islower() else "-s", f"{name}={value}"]  # spider args lower case
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log.open("wb") as out:
        return subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def checkpoint(client: redis.Redis) -> dict:
    (key,) = client.keys("ha:{paged}:cp:*")
    return json.loads(client.get(key))


def wait_for_checkpoint(
    client: redis.Redis, proc: subprocess.Popen, timeout: float, **want: object
) -> None:
    """Poll the checkpoint in Redis until its fields have the *want* values (the point to
    kill the worker at), failing at the deadline or if the worker ended first."""
    deadline = time.monotonic() + timeout
    while True:
        keys = client.keys("ha:{paged}:cp:*")
        saved = json.loads(client.get(keys[0]) or b"{}") if keys else {}
        if all(saved.get(name) == value for name, value in want.items()):
            return
        assert proc.poll() is None, f"the worker ended before the checkpoint {want}: {saved}"
        assert time.monotonic() < deadline, f"no checkpoint {want} in {timeout:g} s: {saved}"
        time.sleep(0.05)


def test_a_100_page_task_killed_at_page_47_resumes_at_47(
    redis_url, redis_client, site_factory, tmp_path
):
    site = site_factory("--pages", "100", "--per-page", "5", "--slow-list", "47:60")
    items = tmp_path / "items.jl"
    first = run_paged(redis_url, site.url, items, tmp_path / "first.log")
    deadline = time.monotonic() + 120
    while not any(path == "/list/47" for _, path, _ in site.log()):
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    wait_for_checkpoint(redis_client, first, 60, page=47, items=46 * 5)
    first.send_signal(signal.SIGKILL)
    first.wait()
    saved = checkpoint(redis_client)
    assert saved["page"] == 47 and saved["items"] == 46 * 5 and not saved["done"]
    assert saved["fields"] == {"pages_seen": 46} and saved["last_id"] == 230
    assert len(json.dumps(saved)) < 400  # a few hundred bytes
    # the queue is lost (flushed); only the checkpoint is left to resume from
    keys = Keys("ha", "paged")
    redis_client.delete(*keys.all())
    before = len(site.log())
    second = run_paged(redis_url, site.url, items, tmp_path / "second.log")
    assert second.wait(timeout=120) == 0
    resumed = [path for _, path, _ in site.log()[before:]]
    assert resumed[0] == "/list/47" and "/list/1" not in resumed
    assert "at page 47 (230 items done)" in (tmp_path / "second.log").read_text()
    ids = [json.loads(line)["id"] for line in items.read_text().splitlines()]
    assert sorted(ids) == list(range(1, 501))  # none lost, none twice
    final = checkpoint(redis_client)
    assert final["done"] and final["items"] == 500 and final["fields"] == {"pages_seen": 100}
    # a finished task is not run again
    third = run_paged(redis_url, site.url, items, tmp_path / "third.log")
    assert third.wait(timeout=60) == 0
    assert "is done (its checkpoint says so)" in (tmp_path / "third.log").read_text()
    assert len(items.read_text().splitlines()) == 500


def test_checkpoints_within_a_page_every_n_items(redis_url, redis_client, site_factory, tmp_path):
    site = site_factory("--pages", "2", "--per-page", "120")
    items = tmp_path / "items.jl"
    first = run_paged(
        redis_url,
        site.url,
        items,
        tmp_path / "first.log",
        HA_CHECKPOINT_ITEMS="50",
        STALL_ITEMS_FROM="101",
    )
    deadline = time.monotonic() + 60
    while count(items) < 100 or not redis_client.keys("ha:{paged}:cp:*"):
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    wait_for_checkpoint(redis_client, first, 60, page=1, skip=100, items=100)
    first.send_signal(signal.SIGKILL)  # items 101-120 are stuck in the pipeline
    first.wait()
    saved = checkpoint(redis_client)
    assert (saved["page"], saved["skip"], saved["items"]) == (1, 100, 100)
    redis_client.delete(*Keys("ha", "paged").all())
    second = run_paged(redis_url, site.url, items, tmp_path / "second.log")
    assert second.wait(timeout=60) == 0
    ids = [json.loads(line)["id"] for line in items.read_text().splitlines()]
    assert sorted(ids) == list(range(1, 241))  # page 1 redone without its first 100 items
    assert "'ha/checkpoint/items_skipped': 100" in (tmp_path / "second.log").read_text()


def count(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


@deferred_f_from_coro_f
async def test_a_stale_worker_cannot_overwrite_a_newer_checkpoint(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([NewEntry(b"", 0, b"page")])
    (old,) = await q.lease(1, 10)
    assert await q.save_checkpoint(old.id, old.token, "t", b'{"page": 5}', 60000)
    import asyncio

    await asyncio.sleep(0.05)
    await q.reclaim(worker="w", interval_ms=1000, batch=10, max_expiries=3)
    (new,) = await q.lease(1, 30000)
    assert await q.save_checkpoint(new.id, new.token, "t", b'{"page": 6}', 60000)
    assert not await q.save_checkpoint(old.id, old.token, "t", b'{"page": 5, "stale": 1}', 60000)
    assert await q.client.get(q.keys.checkpoint("t")) == b'{"page": 6}'
    assert 0 < await q.client.pttl(q.keys.checkpoint("t")) <= 60000
    await q.client.aclose()


def test_checkpoints_cli(redis_url, redis_client):
    from tests.test_dlq import cli

    redis_client.set("ha:{paged}:cp:task-a", json.dumps({"task": "task-a", "page": 3, "items": 40}))
    redis_client.set(
        "ha:{paged}:cp:task-b", json.dumps({"task": "task-b", "done": True, "items": 9})
    )
    listed = cli(redis_url, "checkpoints", "list", "paged").stdout.splitlines()
    assert [line.split()[:3] for line in listed] == [
        ["task-a", "page", "3"],
        ["task-b", "done", "items=9"],
    ]
    shown = json.loads(cli(redis_url, "checkpoints", "show", "paged", "task-a").stdout)
    assert shown["page"] == 3
    assert (
        cli(redis_url, "checkpoints", "reset", "paged", "task-a", "--yes").stdout.strip()
        == "reset 1 checkpoint"
    )
    assert (
        cli(redis_url, "checkpoints", "reset", "paged", "--all", "--yes").stdout.strip()
        == "reset 1 checkpoint"
    )
    assert redis_client.keys("ha:{paged}:cp:*") == []
    redis_client.hset("ha:{paged}:stats", "enqueued", 1)  # the crawl, without checkpoints
    listed = cli(redis_url, "checkpoints", "list", "paged")  # (a QA run: it printed nothing)
    assert (listed.returncode, listed.stdout) == (0, "no checkpoint of paged\n"), listed.stderr


def test_checkpoints_reset_names_a_task_without_one(redis_url, redis_client):
    """A QA run: ``reset t1 t2 nosuch --dry-run`` said "would reset 3", the reset "reset 2",
    exit 0 both, the task without a checkpoint never named (``dlq`` names an ID it lacks)."""
    from tests.test_dlq import cli

    for task in ("t1", "t2"):
        redis_client.set(f"ha:{{paged}}:cp:{task}", json.dumps({"task": task, "page": 3}))
    dry = cli(redis_url, "checkpoints", "reset", "paged", "t1", "t2", "nosuch", "--dry-run")
    assert dry.returncode == 1 and dry.stdout.startswith("would reset 2 checkpoint(s) of paged")
    assert dry.stderr.strip() == "no checkpoint of task nosuch in paged", dry.stderr
    done = cli(redis_url, "checkpoints", "reset", "paged", "t1", "t2", "nosuch", "--yes")
    assert (done.returncode, done.stdout.strip()) == (1, "reset 2 checkpoints"), done.stderr
    assert done.stderr.strip() == "no checkpoint of task nosuch in paged"
    assert redis_client.keys("ha:{paged}:cp:*") == []


def test_checkpoints_cli_reports_an_unreadable_checkpoint_and_resets_it(redis_url, redis_client):
    from tests.test_dlq import cli

    redis_client.set("ha:{paged}:cp:good", json.dumps({"task": "good", "page": 3, "items": 10}))
    redis_client.set("ha:{paged}:cp:text", "not json")
    redis_client.hset("ha:{paged}:cp:hash", "a", "b")
    listed = cli(redis_url, "checkpoints", "list", "paged")
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[:2] for line in listed.stdout.splitlines()] == [
        ["good", "page"],
        ["hash", "unreadable"],
        ["text", "unreadable"],
    ]
    shown = cli(redis_url, "checkpoints", "show", "paged", "hash")
    assert shown.returncode == 1 and "unreadable" in shown.stderr
    reset = cli(redis_url, "checkpoints", "reset", "paged", "--all", "--yes")
    assert reset.stdout.strip() == "reset 3 checkpoints", reset.stderr
    assert redis_client.keys("ha:{paged}:cp:*") == []


def test_a_callback_raising_after_its_next_page_keeps_the_chain(
    redis_url, redis_client, site_factory, tmp_path
):
    site = site_factory("--pages", "5", "--per-page", "3")
    items = tmp_path / "items.jl"
    worker = run_paged(redis_url, site.url, items, tmp_path / "run.log", RAISE_AFTER_NEXT="/list/3")
    assert worker.wait(timeout=120) == 0
    crawled = {path for _, path, _ in site.log()}
    assert {"/list/4", "/list/5"} <= crawled  # a plain Scrapy crawl goes on past page 3
    ids = sorted(json.loads(line)["id"] for line in items.read_text().splitlines())
    assert ids == list(range(1, 16))


def test_a_reclaimed_page_skips_the_items_its_checkpoint_has(
    redis_url, redis_client, site_factory, tmp_path
):
    # one page: a later page of the same task saving its own checkpoint would replace this
    # page's (one checkpoint per task), and the re-run could not skip (see the docs)
    site = site_factory("--pages", "1", "--per-page", "120")
    items = tmp_path / "items.jl"
    fast = {
        "HA_LEASE_TIME": "3",
        "HA_HEARTBEAT_TTL": "3",  # (the killed worker's: waited for at the finish)
        "HA_LEASE_RENEW_INTERVAL": "1",
        "HA_RECLAIM_INTERVAL": "1",
        "HA_CHECKPOINT_ITEMS": "50",
    }
    first = run_paged(
        redis_url, site.url, items, tmp_path / "first.log", STALL_ITEMS_FROM="101", **fast
    )
    deadline = time.monotonic() + 60
    while count(items) < 100 or "skip" not in checkpoint_or_empty(redis_client):
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    wait_for_checkpoint(redis_client, first, 60, skip=100, items=100)
    first.send_signal(signal.SIGKILL)  # page 1 stays leased in Redis until its lease expires
    first.wait()
    assert checkpoint(redis_client)["skip"] == 100
    second = run_paged(redis_url, site.url, items, tmp_path / "second.log", join="1", **fast)
    assert second.wait(timeout=120) == 0
    ids = [json.loads(line)["id"] for line in items.read_text().splitlines()]
    assert sorted(ids) == list(range(1, 121))  # none twice: the reclaimed page skipped 100
    assert "'ha/checkpoint/items_skipped': 100" in (tmp_path / "second.log").read_text()


def checkpoint_or_empty(client: redis.Redis) -> dict:
    return checkpoint(client) if client.keys("ha:{paged}:cp:*") else {}


def test_checkpoints_list_shows_a_checkpoint_of_the_wrong_shape_as_unreadable(
    redis_url, redis_client
):
    """A JSON object with no page number that is not done is garbage to the scripts
    (lib/checkpoint.lua: the next page of its task replaces it); the listing showed
    ``{"page": "x"}`` as ``page x items=0``, as if the task were at a page "x"."""
    from tests.test_dlq import cli

    redis_client.set("ha:{paged}:cp:good", json.dumps({"page": 3, "items": 10}))
    redis_client.set("ha:{paged}:cp:done", json.dumps({"done": True, "items": 9}))
    redis_client.set("ha:{paged}:cp:x", json.dumps({"page": "x"}))
    redis_client.set("ha:{paged}:cp:y", json.dumps({"items": 4}))
    redis_client.set("ha:{paged}:cp:z", json.dumps({"page": True, "done": False}))
    listed = cli(redis_url, "checkpoints", "list", "paged")
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[:2] for line in listed.stdout.splitlines()] == [
        ["done", "done"],
        ["good", "page"],
        ["x", "unreadable"],
        ["y", "unreadable"],
        ["z", "unreadable"],
    ]
    assert "no page number" in listed.stdout.splitlines()[2]
    shown = cli(redis_url, "checkpoints", "show", "paged", "x")  # (before: exit 0, no word)
    assert shown.returncode == 1 and json.loads(shown.stdout) == {"page": "x"}, shown.stderr
    assert "task x is unreadable: no page number, not done" in shown.stderr
    shown = cli(redis_url, "checkpoints", "show", "paged", "good")
    assert shown.returncode == 0 and not shown.stderr, shown.stderr
