"""A continuous crawl in ``scrapy-ha status``, the metrics and the dashboard: revisited URLs,
those due in the next hour, what the visits found, the change rate, bytes 304s saved and
the intervals, from what lua/revisit.lua wrote in a real Redis."""

from __future__ import annotations

import json

import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.keys import Keys
from scrapy_ha.ops.revisits import read_revisits_sync
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.revisits import Revisit, revisit
from scrapy_ha.store.wire import NewEntry
from tests.cli_seed import scrapy_ha
from tests.test_dashboard_api import dashboard
from tests.test_metrics import exporter_factory, value  # noqa: F401, F811 (a fixture)

KEYS = Keys("ha", "cont")
#: (path, what the visit found, seconds to the next, bytes a 304 saved)
VISITS = [("a", "new", 60, 0), ("b", "not_modified", 7200, 5000), ("c", "changed", 30, 0)]


async def seed(redis_url: str) -> None:
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    payloads = {p: f'{{"v":1,"u":"http://a.example/{p}"}}'.encode() for p, *_ in VISITS}
    await q.enqueue([NewEntry(f"fp-{p}".encode(), 0, payloads[p]) for p in payloads])
    leases = await q.lease(3, 30_000)
    by_path = {lease.payload.decode().rsplit("/", 1)[1][:-2]: lease for lease in leases}
    for path, found, seconds, saved in VISITS:
        lease = by_path[path]
        bucket = "60" if seconds <= 60 else "21600"
        fingerprint = f"fp-{path}".encode()
        args = (seconds * 1000, lease.payload, fingerprint, found, saved, bucket)
        assert (await revisit(q, Revisit(lease.id, lease.token, *args))).due > 0
    await q.client.aclose()


EXPECTED = {
    "revisited": 3,
    "due_next_hour": 2,
    "found": {"new": 1, "not_modified": 1, "changed": 1},
    "change_rate": 0.5,
    "saved_bytes": 5000,
    "doubles": 0,
    "intervals": {"60": 2, "21600": 1},
}


@deferred_f_from_coro_f
async def test_status_shows_a_continuous_crawl(redis_url):
    await seed(redis_url)
    shown = scrapy_ha("status", "cont", "--json", "--redis-url", redis_url)
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["revisits"] == EXPECTED
    # revisits wait in the delayed set without an attempt: not retries, and no ETA
    assert doc["waiting"]["revisit"] == {"a.example": 3} and doc["waiting"]["retries"] == 0
    assert doc["eta_seconds"] is None
    text = scrapy_ha("status", "cont", "--redis-url", redis_url).stdout
    assert "delayed  3: 0 retries, 3 revisits waiting for their next visit (a.example 3)" in text
    assert "eta  none: a continuous crawl (revisits) ends only when stopped" in text
    found = "found new 1, changed 1, not_modified 1; changed at 50.0% of the revisits"
    assert f"revisits  3 URLs, 2 due in the next hour; {found}" in text
    assert "304s saved  4.9 KB" in text
    assert "intervals  <=1m 2, <=6h 1" in text


@deferred_f_from_coro_f
async def test_the_dashboard_shows_a_continuous_crawl(redis_url):
    await seed(redis_url)
    with dashboard(redis_url) as http:
        api = http.get("/api/crawls/cont").json()
        page = http.get("/crawls/cont").text
        delayed = http.get("/api/crawls/cont/delayed").json()
    assert api["revisits"] == EXPECTED
    assert api["continuous"] and api["waiting"]["revisit"] == {"a.example": 3}
    assert api["pending_retries"] == 0  # revisits are not retries
    assert "Continuous crawl" in page and "bytes saved by 304s" in page
    assert "3 revisits waiting" in page and ">continuous<" in page
    # the histogram's rows go by their bound, as in status (before, as text: 21600 s first)
    assert page.index("intervals &le; 60 s") < page.index("intervals &le; 21600 s")
    assert {row["class"] for row in delayed["entries"]} == {"revisit"}


@deferred_f_from_coro_f
async def test_delayed_list_says_a_revisit_waits_for_its_next_visit(redis_url):
    await seed(redis_url)
    shown = scrapy_ha("delayed", "list", "cont", "--redis-url", redis_url)
    assert shown.returncode == 0, shown.stderr
    rows = [line for line in shown.stdout.splitlines() if "a.example" in line]
    assert len(rows) == 3 and all(" revisit " in row for row in rows), shown.stdout


@deferred_f_from_coro_f
async def test_the_metrics_of_a_continuous_crawl(redis_url, exporter_factory):  # noqa: F811
    await seed(redis_url)
    samples = exporter_factory(redis_url).scrape()
    spider = {"spider": "cont"}
    assert value(samples, "scrapy_ha_revisited_urls", **spider) == 3
    assert value(samples, "scrapy_ha_revisits_due_soon", **spider) == 2
    assert value(samples, "scrapy_ha_revisits_total", **spider, found="not_modified") == 1
    assert value(samples, "scrapy_ha_revisit_saved_bytes_total", **spider) == 5000
    histogram = "scrapy_ha_revisit_interval_seconds"
    assert value(samples, f"{histogram}_bucket", **spider, le="60.0") == 2
    assert value(samples, f"{histogram}_bucket", **spider, le="21600.0") == 3
    assert value(samples, f"{histogram}_bucket", **spider, le="+Inf") == 3
    assert value(samples, f"{histogram}_sum", **spider) == 60 + 7200 + 30


@deferred_f_from_coro_f
async def test_revisits_past_their_time_count_as_due(redis_url, redis_client):
    """Looked at 3 hours on, all three are due (overdue): before, "0 due in the next
    hour" beside a delayed list that showed them due."""
    await seed(redis_url)
    later = int(redis_client.time()[0]) * 1000 + 3 * 3600 * 1000
    numbers = read_revisits_sync(redis_client, KEYS, later)
    assert numbers.revisited == 3 and numbers.due_soon == 3


@deferred_f_from_coro_f
async def test_a_revisit_made_due_now_counts_as_due(redis_url, redis_client):
    """``delayed retry-now`` (or the dashboard's "retry now") makes the revisit due in two
    hours due now: before, status, the metrics and the dashboard still said "2 due in the
    next hour" beside a delayed list that showed all three due."""
    await seed(redis_url)
    done = scrapy_ha("delayed", "retry-now", "cont", "--all", "--yes", "--redis-url", redis_url)
    assert done.returncode == 0, done.stderr
    shown = scrapy_ha("status", "cont", "--json", "--redis-url", redis_url)
    assert json.loads(shown.stdout)["revisits"]["due_next_hour"] == 3
    now = int(redis_client.time()[0]) * 1000 + 1000
    assert all(due <= now for _, due in redis_client.zrange(KEYS.revisits, 0, -1, withscores=True))
