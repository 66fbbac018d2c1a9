"""``scrapy-ha checkpoints list|show|reset SPIDER``: a crawl's pagination checkpoints."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from scrapy_ha.cli.common import approve, say_missing
from scrapy_ha.store.state import CheckpointStore, UnreadableCheckpoint, shaped

if TYPE_CHECKING:
    import argparse

    from scrapy_ha.store.queue import RedisQueue


def store(queue: RedisQueue) -> CheckpointStore:
    return CheckpointStore(queue.client, queue.keys)


async def checkpoints_list(queue: RedisQueue, args: argparse.Namespace) -> int:
    """One line per task: task, its page (or done), items, size in bytes (or why it is unreadable:
    ``checkpoints reset`` removes it)."""
    entries = await store(queue).entries()
    if not entries:  # (said, as the other listings say theirs: silence looked like a hang)
        print(f"no checkpoint of {queue.keys.spider}")
    for cp in entries:
        if cp.doc is None:
            print(f"{cp.task:<20} unreadable ({cp.problem})")
            continue
        state = "done" if cp.doc.get("done") else f"page {cp.doc.get('page')}"
        print(f"{cp.task:<20} {state:<10} items={cp.doc.get('items', 0):<8} {cp.size} bytes")
    return 0


async def checkpoints_show(queue: RedisQueue, args: argparse.Namespace) -> int:
    """One task's checkpoint (JSON); exit code 1 with why, when the scripts cannot read it."""
    try:
        doc = await store(queue).get(args.task)
    except UnreadableCheckpoint as exc:
        print(f"the checkpoint of task {args.task} is unreadable: {exc}", file=sys.stderr)
        return 1
    if doc is None:
        print(f"no checkpoint for task {args.task} of {queue.keys.spider}", file=sys.stderr)
        return 1
    print(json.dumps(doc, indent=2))
    try:
        shaped(doc)
    except UnreadableCheckpoint as exc:  # (as `list` says: before, shown with exit 0)
        print(f"the checkpoint of task {args.task} is unreadable: {exc}", file=sys.stderr)
        return 1
    return 0


async def checkpoints_reset(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Delete checkpoints (TASKs, or --all): those tasks start from their first page again."""
    if not (args.tasks or args.all):
        print("name TASKs or --all", file=sys.stderr)
        return 1
    checkpoints = store(queue)
    tasks = await checkpoints.tasks() if args.all else args.tasks  # names: garbage too
    # (a QA run: "would reset 3" then "reset 2", exit 0, the task without one never named)
    missing = [] if args.all else await checkpoints.missing(tasks)
    absent = set(missing)
    tasks = [t for t in tasks if t not in absent]
    say_missing("checkpoint of task", missing, queue.keys.spider)
    verdict = approve(args, "reset", f"{len(tasks)} checkpoint(s) of {queue.keys.spider}", tasks)
    if not verdict:  # a dry run: 0, or 1 with a task not found
        return int(bool(missing)) if verdict is None else 1
    n = await checkpoints.delete_all() if args.all else await checkpoints.delete(tasks)
    print(f"reset {n:,} checkpoint{'' if n == 1 else 's'}")
    return 1 if missing else 0
