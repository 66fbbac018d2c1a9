"""``scrapy-ha gates list`` / ``gates open``: the domains a 429 closed for every worker, and
opening them early (:mod:`scrapy_ha.ops.gates`).

A gate holds its domain until the time the site asked for (``Retry-After``, at most
``HA_RETRY_AFTER_MAX``); ``open`` is for an operator who knows the site is fine again: each
worker's next sync opens it, and what waited behind it (its host's parked back queues, the
requests deferred for it) goes at once. A site still rate-limiting closes it again with its
next 429.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from scrapy_ha.cli.common import approve, plural, say_missing
from scrapy_ha.ops.display import humanize, local_time
from scrapy_ha.ops.gates import closed_gates, domain_of, open_gates
from scrapy_ha.ops.operations import server_ms
from scrapy_ha.ops.waiting import read_waiting
from scrapy_ha.store.sharding import shards_of

if TYPE_CHECKING:
    import argparse

    from scrapy_ha.store.queue import RedisQueue


async def gates_list(queue: RedisQueue, args: argparse.Namespace) -> int:
    """The gates closed now, soonest open first: domain, when it opens (local time, and in
    how long), the requests waiting behind it."""
    gates = await closed_gates(queue)
    spider = queue.keys.spider
    if not gates:
        print(f"no closed gate in {spider}")
        return 0
    now = await server_ms(queue.client)
    waiting = await read_waiting(queue.client, [s.keys for s in shards_of(queue)])
    held = waiting.held.get("gate", {})
    width = max(6, *(len(d) for d in gates))
    print(f"{'DOMAIN':<{width}}  {'OPENS':<19} {'IN':>8}  {'WAITING':>7}")
    for domain, until in gates.items():
        wait = humanize((until - now) / 1000)
        print(
            f"{domain:<{width}}  {local_time(until) or '-':<19} {wait:>8}  {held.get(domain, 0):>7}"
        )
    print(f"{plural(len(gates), 'closed gate')} in {spider}")
    return 0


async def gates_open(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Open the gates of the domains named (or ``--all``) now, for every worker."""
    if bool(args.domains) == bool(args.all):
        print("name the domains to open, or --all (not both)", file=sys.stderr)
        return 1
    spider = queue.keys.spider
    gates = await closed_gates(queue)
    named = list(dict.fromkeys(domain_of(d) for d in args.domains or []))
    chosen = list(gates) if args.all else [d for d in named if d in gates]
    missing = [d for d in named if d not in gates]
    if not chosen + missing:  # --all with none: nothing to confirm, nor to open
        print(f"no closed gate in {spider}")
        return 0
    say_missing("closed gate", missing, spider)
    what = f"{plural(len(chosen), 'gate')} of {spider}"
    listed = [f"{d} (closed until {local_time(gates[d])})" for d in chosen]
    listed += [f"{d} (no closed gate: what still waits for it is made due)" for d in missing]
    verdict = approve(args, "open", what, listed)
    if not verdict:  # a dry run: 0, or 1 with a domain not closed
        return int(bool(missing)) if verdict is None else 1
    # (a domain not closed too: what still waits for it goes, if an open of it stopped
    # part way; the confirmed gates only, not one a 429 closed since)
    done = await open_gates(queue, chosen + missing)
    names = ", ".join(sorted(done.gates))
    opened = (
        f"opened {plural(len(done.gates), 'gate')} of {spider} ({names}): each worker opens "
        f"its copy at its next sync"
        if done.gates
        # (before: "no gate of S was closed any more", with another domain's gate closed)
        else f"no gate of {spider} opened: {', '.join(chosen + missing)} had none closed"
    )
    print(
        f"{opened}; {plural(done.queues, 'back queue')} and "
        f"{plural(done.entries, 'delayed request')} that waited for "
        f"{'it' if len(chosen + missing) == 1 else 'them'} made due"
    )
    return 1 if missing else 0
