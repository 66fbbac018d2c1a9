"""`scrapy-ha status` of a sharded crawl (HA_SHARDS=4) with a 429 from each of 220 hosts:
its `parked` line names the domains with the most requests waiting, not all of them."""

from __future__ import annotations

import asyncio

from scrapy.utils.defer import deferred_f_from_coro_f

from tests.cli_seed import scrapy_ha
from tests.test_dashboard_waiting_card import HOSTS, gated_hosts


@deferred_f_from_coro_f
async def test_the_parked_line_names_the_biggest_domains_and_counts_the_rest(redis_url):
    """The line named all 221 domains by name, thousands of characters on one line, the host with
    30 requests waiting somewhere in it (`--json` keeps them all)."""
    await gated_hosts(redis_url, "wide")
    status = await asyncio.to_thread(scrapy_ha, "status", "wide", "--redis-url", redis_url)
    assert status.returncode == 0, status.stderr
    (line,) = (x for x in status.stdout.splitlines() if "parked  pending" in x)
    rest = sorted(HOSTS.values(), reverse=True)[5:]
    total = sum(HOSTS.values())
    assert line.strip().startswith(
        f"parked  pending: {total} behind a closed gate (big.example 30, "
    )
    assert line.endswith(f", and {len(rest)} more domains: {sum(rest)})"), line
    assert len(line) < 200, line
