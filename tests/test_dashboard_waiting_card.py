"""The overview card's "Waiting" of a sharded crawl (HA_SHARDS=4), written by the queue's
own scripts on a real Redis: every reason work waits is said, and a crawl with hundreds of
gated hosts (a 429 on each) keeps a card of a few lines, the most waiting first."""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING

import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.store.sharding import check_shard_count, make_queue
from tests.test_dashboard_pages import MINUTE, _drive, entry, visible

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

    from scrapy_ha.store.queue import RedisQueue


def sharded(url: str, spider: str) -> tuple[redis.asyncio.Redis, RedisQueue]:
    client = redis.asyncio.Redis.from_url(url)
    return client, make_queue(client, "ha", spider, 4)


def card(page: str, spider: str) -> str:
    """The text of *spider*'s card on the overview."""
    start = f'<section class="crawl-card" data-spider="{spider}">'
    found = re.search(re.escape(start) + ".*?</section>", page, re.S)
    assert found, page
    return visible(found[0])


@deferred_f_from_coro_f
async def test_the_card_says_what_waits_when_nothing_is_delayed_or_it_waits_for_a_proxy(
    redis_url,
):
    """Requests parked in their host's queue behind a closed gate are no delayed entries:
    the card read "nothing delayed" beside 6 requests waiting for the gate. Delayed entries
    waiting for a proxy left the card's list empty."""
    client, parked = sharded(redis_url, "parked")
    await check_shard_count(parked)
    await parked.close_gate("shop.example", 20 * MINUTE)
    await parked.sync(enqueue=[entry(f"http://shop.example/{i}") for i in range(6)])
    assert not (await parked.sync(lease=10, lease_ms=600_000)).leases  # parked at the gate
    other, proxied = sharded(redis_url, "proxied")
    await check_shard_count(proxied)
    await proxied.sync(enqueue=[entry(f"http://api.example/{i}") for i in range(2)])
    for x in (await proxied.sync(lease=2, lease_ms=600_000)).leases:
        assert await proxied.retry_later(x.id, x.token, 30_000, b"", held="proxy")
    await client.aclose()
    await other.aclose()

    def check(http: TestClient) -> None:
        assert http.get("/api/crawls/parked").json()["waiting"]["gate"] == {"shop.example": 6}
        page = http.get("/").text
        text = card(page, "parked")
        assert "6 waiting for the gate of shop.example" in text, text
        assert "nothing delayed" not in text
        assert "2 waiting for a proxy" in card(page, "proxied")

    await asyncio.to_thread(_drive, redis_url, check)


#: Hosts a 429 closed, and the requests waiting for each: 1 to 4, and 30 for big.example.
HOSTS = {**{f"h{i}.example": 1 + i % 4 for i in range(220)}, "big.example": 30}


async def gated_hosts(url: str, spider: str) -> None:
    """*spider* with 4 shards and the :data:`HOSTS` gated, their requests parked."""
    client, q = sharded(url, spider)
    await check_shard_count(q)
    for host in HOSTS:
        await q.close_gate(host, 20 * MINUTE)
    urls = [f"http://{host}/{i}" for host, n in HOSTS.items() for i in range(n)]
    requests = [entry(url, f"{n:012}") for n, url in enumerate(urls)]  # (12 distinct bytes)
    await q.sync(enqueue=requests)
    assert not (await q.sync(lease=100, lease_ms=600_000)).leases  # parked at the gates
    await client.aclose()


@deferred_f_from_coro_f
async def test_a_card_with_hundreds_of_gated_hosts_names_the_biggest_and_counts_the_rest(
    redis_url,
):
    """A 429 from each of 220 hosts drew every one on the card, one line each, in the
    order of a hash: 221 lines, the host with 30 requests waiting somewhere among them."""
    await gated_hosts(redis_url, "wide")
    rest = sorted(HOSTS.items(), key=lambda kv: -kv[1])[5:]

    def check(http: TestClient) -> None:
        assert http.get("/api/crawls/wide").json()["waiting"]["gate"] == HOSTS  # all, as before
        text = card(http.get("/").text, "wide")
        gates = re.findall(r"(\d+) waiting for the gate of (\S+)", text)
        assert gates[0] == ("30", "big.example") and len(gates) == 5, gates
        assert [int(n) for n, _ in gates] == sorted((int(n) for n, _ in gates), reverse=True)
        more = f"and {len(rest)} more domains: {sum(n for _, n in rest)} waiting for their gates"
        assert more in text, text
        page = http.get("/crawls/wide").text
        assert 'id="waiting"' in page  # (where "and ... more" leads)
        assert len(re.findall(r'<tr class="gate">', page)) == len(HOSTS)

    await asyncio.to_thread(_drive, redis_url, check)
