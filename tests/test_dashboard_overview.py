"""The overview reads its crawls' summaries concurrently (dashboard/_views.py
``overview_rows``): each is a dozen round trips to Redis, and read one after the other,
580 crawls with Redis 1 ms away took 8.7 s a refresh (0.9 to 1.4 s overlapped, a /tmp
script through bench/latency_proxy.py). Order and unreadable crawls are kept."""

from __future__ import annotations

import asyncio

from scrapy_ha.dashboard import _views
from tests.cli_seed import dead_letters
from tests.test_dashboard_api import dashboard


def test_the_overview_reads_crawls_at_once_and_keeps_their_order(
    redis_url, redis_client, monkeypatch
):
    for n in range(6):
        dead_letters(redis_url, f"crawl{n}", [(f"http://a{n}.test/1", "gone", 404)])
    redis_client.delete("ha:{crawl3}:dead")
    redis_client.set("ha:{crawl3}:dead", "not a sorted set")
    at_once, most = 0, []
    read = _views._overview_row

    async def counted(request, spider):
        nonlocal at_once
        at_once += 1
        most.append(at_once)
        try:
            await asyncio.sleep(0.05)  # (a Redis farther away)
            return await read(request, spider)
        finally:
            at_once -= 1

    monkeypatch.setattr(_views, "_overview_row", counted)
    with dashboard(redis_url) as http:
        answer = http.get("/api/crawls").json()
    assert [c["spider"] for c in answer["crawls"]] == [
        "crawl0",
        "crawl1",
        "crawl2",
        "crawl4",
        "crawl5",
    ]
    assert list(answer["unreadable"]) == ["crawl3"], answer["unreadable"]
    assert max(most) == 6  # (before: 1, one crawl after the other)
