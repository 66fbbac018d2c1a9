"""The dashboard's pages as an operator reads them, with FastAPI's TestClient over a real
Redis written by the queue's own scripts: how far each crawl is, how fast it goes, what
waits and why, human labels, the entry decoded, sharded crawls, the login's rate limit."""

from __future__ import annotations

import asyncio
import html
import json
import re
from html.parser import HTMLParser
from typing import TYPE_CHECKING, Any

import pytest
import redis
import redis.asyncio
import scrapy
from scrapy.http import FormRequest
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha import metakeys
from scrapy_ha.codec import encode_request
from scrapy_ha.dashboard._throttle import LoginThrottle
from scrapy_ha.keys import Keys
from scrapy_ha.ops import operations
from scrapy_ha.ops.stats import read_crawl_stats_async
from scrapy_ha.ops.waiting import eta, read_waiting
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.sharding import check_shard_count, make_queue
from scrapy_ha.store.wire import NewEntry
from tests.cli_seed import scrapy_ha
from tests.test_dashboard_api import dashboard, seed_dead

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

MINUTE = 60_000
#: The meta a retried request carries: its attempts so far and their history.
FAILED = {
    metakeys.RETRIES: {"server": 1},
    metakeys.HISTORY: [{"t": 1_700_000_000_000, "class": "server", "outcome": "HTTP 503"}],
}


class Text(HTMLParser):
    """The text a page shows (what a reader sees without hovering), and its titles."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.titles: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style", "title", "svg"):
            self._hidden += 1
        self.titles += [v or "" for k, v in attrs if k == "title"]

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style", "title", "svg"):
            self._hidden -= 1

    def handle_data(self, data: str) -> None:
        if not self._hidden:
            self.parts.append(data)


def shown(html: str) -> Text:
    text = Text()
    text.feed(html)
    return text


def visible(html: str) -> str:
    return re.sub(r"\s+", " ", " ".join(shown(html).parts))


def entry(url: str, fp: str | None = None, **meta: Any) -> NewEntry:
    return NewEntry(
        (fp or url).encode()[-12:], 0, encode_request(scrapy.Request(url, meta=meta), None)
    )


def queue(url: str, spider: str) -> RedisQueue:
    return RedisQueue(redis.asyncio.Redis.from_url(url), Keys("ha", spider))


async def gated_crawl(url: str) -> RedisQueue:
    """Spider ``shop``: 20 done this minute, 4 retries due in 10 to 15 minutes, 6 requests
    deferred for the closed gate of shop.example (due in 20 minutes), 10 pending."""
    q = queue(url, "shop")
    await q.enqueue([entry(f"http://shop.example/item/{i}") for i in range(40)])
    leases = await q.lease(30, 600_000)
    await q.ack([(x.id, x.token) for x in leases[:20]])
    for n, x in enumerate(leases[20:24]):
        delay = (10 + n) * MINUTE
        retry = encode_request(scrapy.Request(f"http://shop.example/retry/{n}", meta=FAILED), None)
        assert await q.retry_later(x.id, x.token, delay, retry, failure_class="server")
    gate = 20 * MINUTE
    await q.close_gate("shop.example", gate)
    for x in leases[24:30]:
        assert await q.retry_later(x.id, x.token, gate, b"")  # deferred: no attempt
    return q


@deferred_f_from_coro_f
async def test_the_eta_counts_delayed_work_by_its_due_time(redis_url):
    q = await gated_crawl(redis_url)
    stats = await read_crawl_stats_async(q.client, q.keys)
    waiting = await read_waiting(q.client, [q.keys])
    assert (waiting.delayed, waiting.retries, waiting.held_by("gate")) == (10, 4, 6)
    # 20 acks in the last 5 minutes: the 10 pending take about 2.5 minutes, but the gated
    # ones are not due for 20: the crawl cannot end before that
    assert stats.eta_seconds() == 300  # the old ETA: 20 left at 4 acks a minute
    found = eta(stats, waiting)
    assert found.seconds is not None and found.seconds >= 20 * 60
    assert found.last_due_ms is not None and found.last_due_ms >= stats.now_ms + 20 * MINUTE - 5000
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_work_in_progress_counts_in_the_eta_and_a_pause_stops_its_countdown(redis_url):
    """Only leased work left: the ETA still counts it; paused, the API's and the status's
    ETA say none (what moves nothing cannot be counted down)."""
    q = queue(redis_url, "shop")
    await q.enqueue([entry(f"http://shop.example/item/{i}") for i in range(30)])
    leases = await q.lease(30, 600_000)
    await q.ack([(x.id, x.token) for x in leases[:20]])  # 10 in progress, nothing pending
    stats = await read_crawl_stats_async(q.client, q.keys)
    found = eta(stats, await read_waiting(q.client, [q.keys]))
    assert (stats.pending, stats.leased, found.left) == (0, 10, 10)
    assert found.seconds is not None and found.seconds > 0
    assert await operations.pause(q, "tests")
    await q.client.aclose()

    def check(http: TestClient) -> None:
        api = http.get("/api/crawls/shop").json()
        assert api["paused"] is True and api["eta_s"] is None, api

    _drive(redis_url, check)
    status = scrapy_ha("status", "shop", "--redis-url", redis_url)
    assert "eta  none while paused: 10 left" in status.stdout, status.stdout
    doc = json.loads(scrapy_ha("status", "shop", "--json", "--redis-url", redis_url).stdout)
    assert doc["paused"] and doc["eta_seconds"] is None, doc


def _drive(redis_url: str, check: Any) -> None:
    with dashboard(redis_url) as http:
        check(http)


@deferred_f_from_coro_f
async def test_work_waiting_for_a_gate_is_shown_as_such_apart_from_retries(redis_url):
    q = await gated_crawl(redis_url)
    await q.client.aclose()

    def check(http: TestClient) -> None:
        api = http.get("/api/crawls/shop").json()
        assert api["pending_retries"] == 4  # not the 6 deferred for the gate
        assert api["waiting"]["gate"] == {"shop.example": 6}
        assert api["eta_s"] >= 20 * 60
        page = http.get("/crawls/shop").text
        text = visible(page)
        assert "4 retries waiting" in text and "+ 6 waiting for a gate" in text
        # the gate once: in the Waiting table, with its time and why
        assert text.count("gate closed (HTTP 429)") == 1
        assert len(re.findall(r'<tr class="gate"><td><a [^>]*>shop\.example</a>', page)) == 1
        delayed = http.get("/api/crawls/shop/delayed").json()["entries"]
        gated = [e for e in delayed if e["class"] == "gate"]
        assert len(gated) == 6 and all(e["attempts"] == 0 for e in gated)
        assert all("gate is closed" in e["reason"] for e in gated)
        assert {e["class"] for e in delayed} == {"gate", "server"}
        only = http.get("/api/crawls/shop/delayed", params={"class": "gate"}).json()["entries"]
        assert len(only) == 6
        table = visible(http.get("/crawls/shop/delayed").text)
        assert "Waiting for a gate" in table and "unknown" not in table.lower()
        overview = visible(http.get("/").text)
        assert "6 waiting for the gate of shop.example" in overview and "4 retries" in overview

    await asyncio.to_thread(_drive, redis_url, check)


@deferred_f_from_coro_f
async def test_the_overview_says_how_far_how_fast_and_what_waits(redis_url):
    q = await gated_crawl(redis_url)
    await q.client.aclose()

    def check(http: TestClient) -> None:
        (crawl,) = http.get("/api/crawls").json()["crawls"]
        assert crawl["progress"] == {"done": 20, "dead": 0, "left": 20, "known": 40}
        page = http.get("/").text
        text = visible(page)
        assert "20 of 40 requests finished (50.0 %)" in text
        assert re.search(r'class="progress"[^>]*aria-label="20 done, 0 dead-lettered', page)
        assert re.search(r"ETA \d+m \d\ds \(about \d\d:\d\d\)", text) or "ETA" in text
        assert "data-live" in page and 'http-equiv="refresh"' in page  # live, also without JS
        svg = re.search(r'<svg class="chart".*?</svg>', page, re.S)
        assert svg and "pages/s" in svg[0]  # the unit on its axis
        assert re.search(r">\d\d:\d\d</text>", svg[0])  # times on its time axis
        assert "<title>" in svg[0]  # each minute's value on hover

    await asyncio.to_thread(_drive, redis_url, check)


def test_numbers_have_thousands_separators(redis_client):
    seed_dead(redis_client, 12_345)
    url = _url(redis_client)

    def check(http: TestClient) -> None:
        for page in ("/", "/crawls/big", "/crawls/big/dead"):
            text = visible(http.get(page).text)
            assert "12,345" in text and "12345" not in text, page

    _drive(url, check)


def _url(redis_client: Any) -> str:
    kw = redis_client.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/{kw['db']}"


@deferred_f_from_coro_f
async def test_counters_have_human_labels_and_their_meaning_on_hover(redis_url):
    q = queue(redis_url, "labels")
    await q.enqueue(
        [entry(f"http://a.example/{i}") for i in range(4)] + [entry("http://a.example/0")]
    )
    leases = await q.lease(4, 600_000)
    await q.retry_later(leases[0].id, leases[0].token, 0, b"", failure_class="server")
    await q.dead_letter(leases[1].id, leases[1].token, {"class": "gone", "reason": "HTTP 404"})
    again = await q.lease(4, 600_000)
    await q.dead_letter(again[0].id, again[0].token, {"class": "server", "reason": "HTTP 503"})
    await q.client.aclose()

    def check(http: TestClient) -> None:
        page = http.get("/crawls/labels").text
        text, titles = visible(page), shown(page).titles
        for raw in ("retry_dead", "dead:gone", "retried:server", "start_duplicates"):
            assert raw not in text, raw  # shown on hover, never as the label
        for label in ("Retries that failed", "Start requests seen", "Gone", "Server error"):
            assert label in text, label
        assert any(t.startswith("Requests dead-lettered after at least one retry") for t in titles)
        assert any("HTTP 404 or 410" in t for t in titles)

    await asyncio.to_thread(_drive, redis_url, check)


@deferred_f_from_coro_f
async def test_charts_have_axes_units_and_classes_over_an_hour_or_a_day(redis_url):
    q = queue(redis_url, "charts")
    await q.enqueue([entry(f"http://a.example/{i}") for i in range(3)])
    leases = await q.lease(3, 600_000)
    await q.retry_later(leases[0].id, leases[0].token, MINUTE, b"", failure_class="server")
    await q.retry_later(leases[1].id, leases[1].token, MINUTE, b"", failure_class="network")
    await q.dead_letter(leases[2].id, leases[2].token, {"class": "gone", "reason": "HTTP 404"})
    await q.client.aclose()

    def check(http: TestClient) -> None:
        hour = http.get("/crawls/charts").text
        charts = re.findall(r'<figure class="chart-box">.*?</figure>', hour, re.S)
        assert len(charts) == 3
        assert ["pages/s", "retries/min", "dead letters/min"] == [
            re.search(r'<text class="unit"[^>]*>([^<]+)<', c)[1] for c in charts
        ]
        assert "Server error" in charts[1] and "Network" in charts[1] and "Gone" in charts[2]
        assert re.search(r"<title>\d\d:\d\d: [^<]*Server error 1[^<]*</title>", charts[1])
        # a crawl that began this minute: the hour charts span its life, 15 minutes
        assert all("last 15 minutes" in c for c in charts)
        assert re.search(r">\d\d:\d[05]</text>", charts[0])  # a time label every 5 minutes
        day = http.get("/crawls/charts", params={"window": "day"}).text
        assert day.count("last day") >= 3
        assert re.search(r"<title>\d\d:\d\d–\d\d:\d\d: ", day)  # 10-minute bins
        assert http.get("/crawls/charts", params={"window": "week"}).status_code == 400

    await asyncio.to_thread(_drive, redis_url, check)


@deferred_f_from_coro_f
async def test_a_requeue_today_is_explained_beside_the_dead_letters_now(redis_url):
    q = queue(redis_url, "today")
    await q.enqueue([entry(f"http://a.example/{i}") for i in range(3)])
    for x in await q.lease(3, 600_000):
        await q.dead_letter(x.id, x.token, {"class": "gone", "reason": "HTTP 404"})
    await q.client.aclose()

    def check(http: TestClient) -> None:
        first = http.get("/api/crawls/today/dead").json()["entries"][0]["id"]
        http.post("/api/crawls/today/actions/requeue", json={"ids": [first]})
        api = http.get("/api/crawls/today").json()
        assert (api["dead"], api["today"]["dead"], api["today"]["requeued"]) == (2, 3, 1)
        text = visible(http.get("/crawls/today").text)
        assert "dead letters now 3 dead-lettered today, 1 requeued" in text

    await asyncio.to_thread(_drive, redis_url, check)


class Spiderless(scrapy.Spider):
    name = "entry"

    def parse_product(self, response: Any) -> None:
        pass


# Scrapy 2.16 warns FormRequest deprecated (2.19 only its from_response): users of 2.16 have it
@pytest.mark.filterwarnings("ignore:scrapy.http.FormRequest is deprecated")
@deferred_f_from_coro_f
async def test_the_entry_page_shows_the_request_decoded_and_masked(redis_url):
    q = queue(redis_url, "entry")
    spider = Spiderless()
    request = FormRequest(
        "https://shop.example/login?apiKey=key-S1",
        formdata={"user": "alice", "password": "pw-S2"},
        headers={"X-Api-Key": "hdr-S3", "Accept-Language": "fr"},
        callback=spider.parse_product,
        priority=7,
        meta={"shelf": "7", "http_pass": "meta-S4"},
    )
    await q.enqueue([NewEntry(b"entry-fp-1", 7, encode_request(request, spider))])
    (x,) = await q.lease(1, 600_000)
    history = [{"t": 1_700_000_000_000, "class": "server", "outcome": "HTTP 503", "worker": "w"}]
    info = {"class": "server", "reason": "HTTP 503", "status": 503, "history": history}
    await q.dead_letter(x.id, x.token, info)
    bad = {"v": 1, "u": "javascript:alert(1)"}  # what someone with Redis access may write
    await q.client.zadd(q.keys.dead, {"666": 1})
    await q.client.hset(q.keys.payload, "666", json.dumps(bad))
    await q.client.aclose()

    def check(http: TestClient) -> None:
        page = http.get(f"/crawls/entry/dead/{x.id}").text
        text = visible(page)
        assert not [s for s in ("key-S1", "pw-S2", "hdr-S3", "meta-S4") if s in page]
        assert re.search(
            r'<h1>POST <a class="url" href="https://shop\.example/login\?apiKey=\*\*\*"', page
        )
        for shown_ in (
            "parse_product",
            "Priority 7",
            "Accept-Language fr",
            "X-Api-Key ***",
            "password=***",
            '"shelf": "7"',
            "Server error",
            "HTTP 503",
        ):
            assert shown_ in text, shown_
        assert "2023-11-14 22:13:20" in text or re.search(r"2023-11-1\d \d\d:\d\d:20", text)
        raw = html.unescape(re.search(r'<details class="raw">.*?</details>', page, re.S)[0])
        assert '"u": "https://shop.example/login?apiKey=***"' in raw  # the stored form, behind
        decoded = http.get(f"/api/crawls/entry/dead/{x.id}").json()["shown"]
        assert decoded["method"] == "POST" and decoded["callback"] == "parse_product"
        bad_page = http.get("/crawls/entry/dead/666").text
        assert 'href="javascript:' not in bad_page and "not a web link" in bad_page

    await asyncio.to_thread(_drive, redis_url, check)


@deferred_f_from_coro_f
async def test_the_confirmation_names_urls_and_a_crawl_action_reads_well(redis_url):
    q = queue(redis_url, "confirm")
    await q.enqueue([entry(f"http://a.example/page-{i}") for i in range(2)])
    for x in await q.lease(2, 600_000):
        await q.dead_letter(x.id, x.token, {"class": "gone", "reason": "HTTP 404"})
    await q.client.aclose()

    def check(http: TestClient) -> None:
        ids = [e["id"] for e in http.get("/api/crawls/confirm/dead").json()["entries"]]
        csrf = http.cookies.get("ha_dashboard_csrf") or http.get("/").cookies["ha_dashboard_csrf"]
        confirm = http.post(
            "/crawls/confirm/actions/purge", data={"csrf": _csrf(http), "ids": ids}
        ).text
        assert "http://a.example/page-0" in confirm and "http://a.example/page-1" in confirm
        pause = visible(http.post("/crawls/confirm/actions/pause", data={"csrf": _csrf(http)}).text)
        assert "Pause the crawl confirm?" in pause and "Pause of" not in pause
        assert csrf

    await asyncio.to_thread(_drive, redis_url, check)


def _csrf(http: TestClient) -> str:
    """The form token of this browser, as a page's form carries it."""
    page = http.get("/").text
    found = re.search(r'name="csrf" value="([^"]+)"', page) or re.search(
        r'name="csrf" value="([^"]+)"', http.get("/crawls/confirm").text
    )
    assert found
    return found[1]


def test_the_since_placeholder_fits_its_field(redis_client):
    seed_dead(redis_client, 1)

    def check(http: TestClient) -> None:
        page = http.get("/crawls/big/dead").text
        field = re.search(r'<input name="since"[^>]*>', page)[0]
        size = int(re.search(r'size="(\d+)"', field)[1])
        placeholder = re.search(r'placeholder="([^"]+)"', field)[1]
        assert size >= len(placeholder), (size, placeholder)

    _drive(_url(redis_client), check)


@deferred_f_from_coro_f
async def test_a_sharded_crawl_is_one_crawl_on_every_page(redis_url):
    client = redis.asyncio.Redis.from_url(redis_url)
    q = make_queue(client, "ha", "wide", 3)
    await check_shard_count(q)
    await q.sync(enqueue=[entry(f"http://s{i % 4}.example/{i}") for i in range(30)])
    leases = (await q.sync(lease=30, lease_ms=600_000)).leases
    for n, x in enumerate(leases[:24]):
        await q.dead_letter(x.id, x.token, {"class": "gone" if n % 2 else "server", "reason": "x"})
        await asyncio.sleep(0.002)  # distinct times: a merge by time is checkable
    await q.retry_later(leases[24].id, leases[24].token, MINUTE, b"", failure_class="server")
    await client.aclose()

    def check(http: TestClient) -> None:
        seen, cursor, times = [], None, []
        while True:
            params = {"size": 5, **({"cursor": cursor} if cursor else {})}
            page = http.get("/api/crawls/wide/dead", params=params).json()
            assert page["total_in_window"] == 24
            seen += [e["id"] for e in page["entries"]]
            times += [e["at"] for e in page["entries"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert len(seen) == len(set(seen)) == 24
        assert times == sorted(times, reverse=True)  # newest first across the shards
        assert any(":" in i for i in seen)  # ids of shards 1 and up, as workers show them
        gone = http.get("/api/crawls/wide/dead", params={"class": "gone", "size": 50}).json()
        assert len(gone["entries"]) == 12
        other = next(i for i in seen if ":" in i)
        home = next(i for i in seen if ":" not in i)
        assert http.get(f"/crawls/wide/dead/{other}").status_code == 200
        done = http.post("/api/crawls/wide/actions/requeue", json={"ids": [other, home]}).json()
        assert done["touched"] == 2
        assert http.get("/api/crawls/wide").json()["dead"] == 22
        assert len(http.get("/api/crawls/wide/delayed").json()["entries"]) == 1
        everything = {"filter": {"class": "gone"}, "dry_run": True}
        assert http.post("/api/crawls/wide/actions/purge", json=everything).json()["selected"] > 0
        assert "3 shards" in visible(http.get("/").text)

    await asyncio.to_thread(_drive, redis_url, check)


def test_the_login_form_refuses_an_address_after_five_wrong_tokens(redis_url):
    with dashboard(redis_url, token="t0ken", base_url="http://dash.example:9411") as http:
        for _ in range(5):
            wrong = http.post("/login", data={"token": "guess", "next": "/"})
            assert wrong.status_code == 200 and "wrong token" in wrong.text
        refused = http.post("/login", data={"token": "t0ken", "next": "/"})
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 0
        assert "too many wrong tokens" in refused.text
        assert "ha_dashboard_session" not in refused.cookies  # the right token did not count


def test_the_throttle_forgets_after_its_window_and_a_right_token_clears_it():
    now = [0.0]
    throttle = LoginThrottle(max_failures=2, window_s=60, clock=lambda: now[0])
    throttle.failed("a")
    throttle.failed("a")
    assert throttle.wait("a") == 60 and throttle.wait("b") == 0
    now[0] = 30
    assert throttle.wait("a") == 30
    now[0] = 60.5
    assert throttle.wait("a") == 0  # the oldest left the window
    throttle.failed("a")
    throttle.passed("a")
    throttle.failed("a")
    assert throttle.wait("a") == 0


def test_x_forwarded_for_does_not_pass_the_login_throttle_and_the_proto_is_read(redis_url):
    """The real command, as a user starts it: uvicorn took the client's address from
    X-Forwarded-For when the request came from 127.0.0.1, so a guesser naming a new
    address each time was never throttled (and the access log showed the address made up).
    X-Forwarded-Proto from 127.0.0.1 is still read (review: a browser without
    Sec-Fetch-Site behind an HTTPS proxy sends an https Origin; turning uvicorn's proxy
    headers off refused its login, 403)."""
    import urllib.error
    import urllib.parse
    import urllib.request

    from scrapy_ha.demo import harness
    from tests.test_cli import SCRAPY_HA

    port = harness.free_port()
    proc = harness.spawn(
        [SCRAPY_HA, "--redis-url", redis_url, "dashboard", "--port", str(port), "--token", "t0k"]
    )
    url = f"http://127.0.0.1:{port}/login"

    def login(n: int, **headers: str) -> int:
        data = urllib.parse.urlencode({"token": f"guess{n}", "next": "/"}).encode()
        headers = headers or {"X-Forwarded-For": f"10.0.0.{n}"}
        request = urllib.request.Request(url, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return 0

    try:
        harness.wait_for(lambda: login(0) == 200, "the dashboard", 60)
        proxied = {"X-Forwarded-Proto": "https", "Origin": f"https://127.0.0.1:{port}"}
        assert login(1, **proxied) == 200  # a wrong token's page, not 403
        codes = [login(n) for n in range(2, 9)]
        assert 429 in codes, codes
    finally:
        harness.stop(proc)


def test_a_redis_gone_is_a_503_that_says_so_and_every_answer_keeps_out_of_frames():
    """Redis down was a bare 500 ("Internal Server Error"), /openapi.json described the API,
    the login page's stylesheet went to the login page, and no header kept a page out of
    another site's frame or a body from being read as another type."""
    from scrapy_ha.demo import harness

    gone = f"redis://127.0.0.1:{harness.free_port()}/0"  # nothing listens there
    with dashboard(gone) as http:
        page, api = http.get("/"), http.get("/api/crawls")
        assert page.status_code == 503 and "Redis did not answer" in page.text, page.text
        assert api.status_code == 503 and "Redis did not answer" in api.json()["error"]
        assert page.headers["X-Frame-Options"] == "DENY"
        assert page.headers["X-Content-Type-Options"] == "nosniff"
        assert http.get("/openapi.json").status_code == 404
    with dashboard(gone, token="t0k") as http:
        assert http.get("/static/dashboard.css").status_code == 200
        assert http.get("/api/crawls").status_code == 401


def test_a_user_redis_refuses_is_said_as_such_not_as_a_redis_gone(redis_url):
    """Review: a wrong password read "Redis did not answer ...; reload once it is back"."""
    wrong = redis_url.replace("redis://", "redis://nobody:wrong@")
    with dashboard(wrong) as http:
        page = http.get("/")
        assert page.status_code == 503
        assert "Redis refused the dashboard's user" in page.text, page.text
        assert "--redis-url" in page.text and "reload" not in page.text


def test_pages_and_the_api_answer_head_as_an_uptime_check_sends_it(redis_client):
    """``HEAD /`` was a 405 (a monitor's uptime check read the dashboard as broken)."""
    seed_dead(redis_client, 3)
    url = _url(redis_client)

    def check(http: TestClient) -> None:
        for path in ("/", "/crawls/big", "/crawls/big/dead", "/api/crawls", "/api/crawls/big"):
            answer = http.head(path)
            assert answer.status_code == 200, (path, answer.status_code)
            assert answer.headers["X-Frame-Options"] == "DENY"
        assert http.head("/crawls/nothing-here").status_code == 404
        assert http.request("DELETE", "/").status_code == 405

    _drive(url, check)


def test_the_speed_now_is_the_last_minute_not_the_minute_so_far():
    """ "pages/s now" was the current minute's acks over the seconds it had run: in the first
    seconds of every minute, before a worker's round acked anything, a crawl of 10 pages/s
    read 0 (and a crawl that stopped read 0 at once, where the last minute still saw it)."""
    import pytest  # noqa: PLC0415

    from scrapy_ha.dashboard._chart import speed  # noqa: PLC0415
    from scrapy_ha.ops.stats import CrawlStats  # noqa: PLC0415
    from scrapy_ha.store.wire import Counts  # noqa: PLC0415

    def at(ms: int, acked: dict[int, int]) -> float:
        counts = Counts(ms, 0, 0, 0, 0, 1, 0)
        return speed(CrawlStats.of("s", counts, counters={}, minutes={"acked": acked}))

    minute = 29_000_000 * 60_000
    steady = {29_000_000 - 1: 600}  # 10 a second, a minute long, and this minute begun
    assert at(minute + 500, steady) == pytest.approx(600 * 59.5 / 60 / 60)  # was 0
    assert at(minute + 30_000, {**steady, 29_000_000: 300}) == pytest.approx(10.0)
    assert at(minute + 59_999, {**steady, 29_000_000: 600}) == pytest.approx(10.0, rel=1e-3)
    # a crawl whose acks began this minute: over the part of it that has passed
    assert at(minute + 4_000, {29_000_000: 40}) == pytest.approx(10.0)
    assert at(minute + 200, {29_000_000: 4}) == pytest.approx(4.0)  # (at least a second)
    # one that began in the last seconds of the minute before: not spread over all of it
    assert at(minute + 5_000, {29_000_000 - 1: 100, 29_000_000: 50}) == pytest.approx(10.0)
    # a slow crawl, one ack every two minutes, read a second after one (review: 1.0/s)
    slow = {29_000_000 - 2: 1, 29_000_000: 1}
    assert at(minute + 1_000, slow) == pytest.approx(1 / 60)
    # one that stopped: the last minute still saw it, fading
    assert at(minute + 30_000, {29_000_000 - 2: 600, **steady}) == pytest.approx(5.0)
    assert at(minute, {}) == 0.0


@deferred_f_from_coro_f
async def test_work_waiting_for_a_proxy_is_shown_as_such_everywhere(redis_url):
    """Waits for a proxy left the retries' figures and reached none other: the crawl page
    read "0 retries waiting" with 2 delayed, and `delayed list`'s last line counted none
    (review)."""
    q = queue(redis_url, "shop")
    await q.enqueue([entry(f"http://shop.example/item/{i}") for i in range(3)])
    leases = await q.lease(3, 600_000)
    for x in leases[:2]:
        assert await q.retry_later(x.id, x.token, 30_000, b"", held="proxy")
    await q.client.aclose()

    def check(http: TestClient) -> None:
        api = http.get("/api/crawls/shop").json()
        assert api["pending_retries"] == 0 and api["waiting"]["proxy"] == {"shop.example": 2}
        assert "+ 2 waiting for a proxy" in visible(http.get("/crawls/shop").text)

    _drive(redis_url, check)
    listed = scrapy_ha("delayed", "list", "shop", "--redis-url", redis_url).stdout
    assert "2 delayed requests listed (2 waiting for a proxy)" in listed, listed
    status = scrapy_ha("status", "shop", "--redis-url", redis_url).stdout
    assert "2: 0 retries, 2 waiting for a usable proxy (shop.example 2)" in status, status
