"""The dashboard's JSON API and pages, with FastAPI's TestClient, on real dead letters in a
real Redis (a real crawl made them)."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis.asyncio
import scrapy
from fastapi.testclient import TestClient
from scrapy.core.engine import ExecutionEngine
from scrapy.http import FormRequest, JsonRequest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha import metakeys
from scrapy_ha.codec import encode_request
from scrapy_ha.dashboard import _tables
from scrapy_ha.dashboard._guard import CSRF_COOKIE
from scrapy_ha.dashboard.app import create_app
from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry
from tests.spiders import FaultSpider
from tests.test_retry_crawl import FAST_RETRIES

if TYPE_CHECKING:
    from collections.abc import Iterator

#: Dead-lettered: two gone (class gone), one 503 after its retries (class server); one ok.
PATHS = ("/status/404", "/status/410", "/flaky/2?fail=9&status=503", "/item/5")
#: The console script installed with the package (what users run).
SCRAPY_HA = str(Path(sys.executable).parent / "scrapy-ha")
LOCAL = "http://127.0.0.1"


@pytest.fixture(autouse=True)
def fast_engine_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ExecutionEngine, "_SLOT_HEARTBEAT_INTERVAL", 0.2)


async def crawl(redis_url: str, site: Any, spider: type[scrapy.Spider] = FaultSpider, **kw: Any):
    crawler = get_crawler(spider, {**FAST_RETRIES, "REDIS_URL": redis_url, **kw.pop("s", {})})
    await crawler.crawl_async(base_url=site.url, **kw)
    return crawler


@contextmanager
def dashboard(
    redis_url: str, *, token: str | None = None, base_url: str = LOCAL
) -> Iterator[TestClient]:
    client = redis.asyncio.Redis.from_url(redis_url)
    app = create_app(client, "ha", token=token, close_client=True)
    with TestClient(app, base_url=base_url, follow_redirects=False) as http:
        yield http


def form_token(page: str) -> str:
    """The CSRF token the forms of *page* carry."""
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None
    return found.group(1)


def by_path(entries: list[dict[str, Any]], site: Any) -> dict[str, dict[str, Any]]:
    return {e["url"].replace(site.url, ""): e for e in entries}


@deferred_f_from_coro_f
async def test_overview_tables_filters_and_requeue_through_the_api(redis_url, site):
    await crawl(redis_url, site, paths=PATHS)
    with dashboard(redis_url) as http:
        (faults,) = http.get("/api/crawls").json()["crawls"]
        assert faults["spider"] == "faults" and faults["dead"] == 3 and not faults["paused"]
        assert len(faults["pages_per_s_last_hour"]) == 60
        assert sum(faults["pages_per_s_last_hour"]) > 0  # the page that was acked
        assert 'points="' in http.get("/").text

        crawl_page = http.get("/api/crawls/faults").json()
        assert crawl_page["dead_by_class"] == {"gone": 2, "server": 1}
        assert crawl_page["today"]["dead"] == 3

        gone = http.get("/api/crawls/faults/dead", params={"class": "gone"}).json()
        assert set(by_path(gone["entries"], site)) == {"/status/404", "/status/410"}
        server = http.get("/api/crawls/faults/dead", params={"status": "503"}).json()["entries"]
        assert [(e["class"], e["attempts"], e["reason"]) for e in server] == [
            ("server", 3, "HTTP 503")
        ]
        assert (
            http.get("/api/crawls/faults/dead", params={"since": "1h"}).json()["total_in_window"]
            == 3
        )
        assert http.get("/api/crawls/faults/dead", params={"until": "1h"}).json()["entries"] == []

        entry = http.get(f"/api/crawls/faults/dead/{server[0]['id']}").json()
        assert [h["class"] for h in entry["history"]] == ["server"] * 3

        gone_404 = by_path(gone["entries"], site)["/status/404"]["id"]
        done = http.post("/api/crawls/faults/actions/requeue", json={"ids": [gone_404]}).json()
        assert done["touched"] == 1 and done["report"] == "requeued 1 of 1 entry"
        left = http.get("/api/crawls/faults/dead").json()["entries"]
        assert gone_404 not in {e["id"] for e in left} and len(left) == 2
        assert http.get("/api/crawls/faults").json()["pending"] == 1

        flt = {"filter": {"class": "server"}}
        dry = http.post("/api/crawls/faults/actions/purge", json={**flt, "dry_run": True}).json()
        assert dry == {
            "action": "purge",
            "dry_run": True,
            "selected": 1,
            "missing": 0,
            "touched": 0,
        }
        assert http.post("/api/crawls/faults/actions/purge", json=flt).json()["touched"] == 1
        assert [e["class"] for e in http.get("/api/crawls/faults/dead").json()["entries"]] == [
            "gone"
        ]


def seed_dead(redis_client: Any, n: int, spider: str = "big") -> None:
    """*n* dead letters as workers write them (every 100th of class ``rare``)."""
    pipe = redis_client.pipeline(transaction=False)
    for i in range(n):
        fclass = "rare" if i % 100 == 0 else "gone"
        info = {"class": fclass, "reason": "HTTP 404", "status": 404, "attempts": 1}
        pipe.zadd(f"ha:{{{spider}}}:dead", {str(i): 1_700_000_000_000 + i})
        pipe.hset(f"ha:{{{spider}}}:dead_info", str(i), json.dumps(info))
        pipe.hset(f"ha:{{{spider}}}:payload", str(i), json.dumps({"v": 1, "u": f"http://x/{i}"}))
    pipe.execute()


@deferred_f_from_coro_f
async def test_all_that_match_a_time_window_alone_are_its_ids_by_rank(redis_client):
    """Without a filter on content the ids are read by rank, not as rows (100,000 took
    2.6 s of the loop's CPU): the same ids, the window's bounds included, in rank order."""
    from scrapy_ha.dashboard._tables import ID_BATCH, Filter, Tables  # noqa: PLC0415

    seed_dead(redis_client, ID_BATCH + 500)
    redis_client.hdel("ha:{big}:payload", "7")  # (a letter whose request is gone: an id still)
    base = 1_700_000_000_000

    async def ids(flt: Filter) -> list[str]:
        tables = Tables(redis.asyncio.Redis.from_url(_url(redis_client)), Keys("ha", "big"))
        try:
            return await tables.all_ids(tables.keys.dead, flt)
        finally:
            await tables.client.aclose()

    every = await ids(Filter())
    assert every == [str(i) for i in range(ID_BATCH + 500)]
    window = Filter(since_ms=base + 5, until_ms=base + ID_BATCH + 2)
    assert await ids(window) == [str(i) for i in range(5, ID_BATCH + 3)]
    assert await ids(Filter(since_ms=base + 10**9)) == []


def test_pages_are_read_by_rank_newest_first_and_a_deep_page_reads_only_itself(redis_client):
    seed_dead(redis_client, 3000)
    with dashboard(_url(redis_client)) as http:
        first = http.get("/api/crawls/big/dead", params={"size": 50}).json()
        assert [e["id"] for e in first["entries"]] == [str(i) for i in range(2999, 2949, -1)]
        assert first["total_in_window"] == 3000 and first["next_cursor"].endswith(_hex("2949"))
        deep = http.get("/api/crawls/big/dead", params={"size": 50, "cursor": 1000}).json()
        assert [e["id"] for e in deep["entries"]][:2] == ["1000", "999"]
        assert deep["scanned"] == 50  # the page only, however deep
        seen: list[str] = []
        cursor = None
        while True:
            params = {"class": "rare", "size": 7, **({"cursor": cursor} if cursor else {})}
            page = http.get("/api/crawls/big/dead", params=params).json()
            seen += [e["id"] for e in page["entries"]]
            if page["next_cursor"] is None:
                break
            cursor = page["next_cursor"]
        assert seen == [str(i) for i in range(2900, -1, -100)]


def _hex(entry_id: str) -> str:
    """How a cursor names the entry its page starts with."""
    return "_" + entry_id.encode().hex()


def _url(redis_client: Any) -> str:
    kw = redis_client.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/{kw['db']}"


@deferred_f_from_coro_f
async def test_a_token_guards_every_page_and_the_login_form_sets_a_cookie(redis_url, site):
    await crawl(redis_url, site, paths=PATHS[:1])
    with dashboard(redis_url, token="t0ken", base_url="http://dash.example:9411") as http:
        assert http.get("/api/crawls").status_code == 401
        assert http.get("/", follow_redirects=False).headers["location"] == "/login?next=%2F"
        assert http.get("/api/crawls", headers={"Authorization": "Bearer t0ken"}).status_code == 200
        assert http.get("/api/crawls", headers={"X-HA-Token": "wrong"}).status_code == 401
        wrong = http.post("/login", data={"token": "nope", "next": "/"})
        assert wrong.status_code == 200 and "wrong token" in wrong.text
        assert "t0ken" not in str(http.cookies)
        ok = http.post("/login", data={"token": "t0ken", "next": "/crawls/faults"})
        assert ok.status_code == 303 and ok.headers["location"] == "/crawls/faults"
        assert "t0ken" not in str(http.cookies)  # the cookie holds a value derived from it
        assert http.get("/crawls/faults").status_code == 200


def test_without_a_token_only_loopback_host_names_are_answered(redis_url):
    with dashboard(redis_url, base_url="http://evil.example:9411") as http:
        assert http.get("/api/crawls").status_code == 421
    with dashboard(redis_url, base_url="http://localhost:9411") as http:
        assert http.get("/api/crawls").status_code == 200


@deferred_f_from_coro_f
async def test_a_form_action_needs_its_csrf_token_and_a_confirmation(redis_url, site):
    await crawl(redis_url, site, paths=PATHS[:2])
    with dashboard(redis_url) as http:
        table = http.get("/crawls/faults/dead", params={"class": "gone"})
        assert table.status_code == 200 and table.text.count('name="ids"') == 2
        csrf = form_token(table.text)
        assert csrf != http.cookies[CSRF_COOKIE]  # derived from it (tests/test_dashboard_csrf.py)
        entry_id = http.get("/api/crawls/faults/dead").json()["entries"][0]["id"]
        url = "/crawls/faults/actions/requeue"
        assert http.post(url, data={"ids": entry_id}).status_code == 403
        assert http.post(url, data={"ids": entry_id, "csrf": "forged"}).status_code == 403
        confirm = http.post(url, data={"ids": entry_id, "csrf": csrf})
        assert confirm.status_code == 200 and "Requeue 1 entry of faults?" in confirm.text
        assert http.get("/api/crawls/faults").json()["dead"] == 2  # nothing done yet
        done = http.post(url, data={"ids": entry_id, "csrf": csrf, "confirm": "yes"})
        assert "Requeued 1 of 1 entry." in done.text
        assert http.get("/api/crawls/faults").json()["dead"] == 1
        form_to_api = http.post("/api/crawls/faults/actions/purge", data={"ids": "x"})
        assert form_to_api.status_code == 415  # a page of another site cannot post JSON


#: What a spider's request may carry that must never appear on a page.
SECRETS = ("bearer-S1", "cookie-S2", "jar-S3", "proxy-S4", "pass-S5")
#: The header values as the payload stores them (base64): not on a page either.
ENCODED = tuple(base64.b64encode(v).decode() for v in (b"Bearer bearer-S1", b"sid=cookie-S2"))


class CredentialSpider(scrapy.Spider):
    """One request to a gone page with every kind of credential a spider can give."""

    name = "creds"

    def __init__(self, base_url: str = "", proxy: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base_url, self.proxy = base_url, proxy

    async def start(self) -> Any:
        yield scrapy.Request(
            f"{self.base_url}/status/404",
            headers={"Authorization": "Bearer bearer-S1", "Cookie": "sid=cookie-S2"},
            cookies={"jar": "jar-S3"},
            meta={
                "proxy": self.proxy,
                "http_user": "alice",
                "http_pass": "pass-S5",
                "http_auth_domain": None,
            },
            errback=self.on_error,
        )

    def on_error(self, failure: Any) -> None:
        pass


@deferred_f_from_coro_f
async def test_no_page_shows_a_credential(redis_url, redis_client, site, proxy_factory):
    proxy = proxy_factory()
    proxy_url = proxy.url.replace("http://", "http://bob:proxy-S4@")
    await crawl(redis_url, site, CredentialSpider, proxy=proxy_url)
    stored = b"".join(redis_client.hvals("ha:{creds}:payload"))
    # the spider's own header is kept (base64 in the payload): the next worker sends it too
    assert base64.b64encode(b"Bearer bearer-S1") in stored
    with dashboard(redis_url) as http:
        (entry,) = http.get("/api/crawls/creds/dead").json()["entries"]
        pages = [
            "/",
            "/crawls/creds",
            "/crawls/creds/dead",
            f"/crawls/creds/dead/{entry['id']}",
            "/api/crawls",
            "/api/crawls/creds",
            "/api/crawls/creds/dead",
            f"/api/crawls/creds/dead/{entry['id']}",
        ]
        for page in pages:
            text = http.get(page).text
            leaked = [s for s in SECRETS + ENCODED if s in text]
            assert not leaked, f"{page} shows {leaked}"
        shown = http.get(f"/crawls/creds/dead/{entry['id']}").text
        assert "Authorization" in shown and "***" in shown and "alice" in shown


def test_the_command_refuses_another_bind_without_a_token(redis_url):
    out = subprocess.run(
        [SCRAPY_HA, "--redis-url", redis_url, "dashboard", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "--token" in out.stderr and "HA_DASHBOARD_TOKEN" in out.stderr


async def delay_one(redis_url: str, url: str, delay_ms: int) -> str:
    """A request that failed twice (server, HTTP 503) and waits for its retry, moved to the
    delayed set by the scripts a worker runs."""
    request = scrapy.Request(url)
    request.meta[metakeys.RETRIES] = {"server": 2}
    request.meta[metakeys.HISTORY] = [
        {"t": 1, "class": "server", "outcome": "HTTP 503", "worker": "w", "proxy": None},
        {"t": 2, "class": "server", "outcome": "HTTP 503", "worker": "w", "proxy": None},
    ]
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        queue = RedisQueue(client, Keys("ha", "slow"))
        await queue.enqueue([NewEntry(b"", 0, encode_request(scrapy.Request(url), None))])
        (lease,) = await queue.lease(1, 30_000)
        payload = encode_request(request, None)
        assert await queue.retry_later(
            lease.id, lease.token, delay_ms, payload, failure_class="server"
        )
        return lease.id
    finally:
        await client.aclose()


@deferred_f_from_coro_f
async def test_delayed_retries_show_their_last_failure_and_next_retry(redis_url):
    # (a secret no hex token of the page can hold: "abc" was found in a form's CSRF token)
    entry_id = await delay_one(redis_url, "http://shop.example/item/7?token=s3cr3t", 600_000)
    with dashboard(redis_url) as http:
        (row,) = http.get("/api/crawls/slow/delayed").json()["entries"]
        assert row["id"] == entry_id and row["url"] == "http://shop.example/item/7?token=***"
        assert (row["class"], row["attempts"], row["reason"]) == ("server", 2, "HTTP 503")
        now = http.get("/api/crawls/slow").json()["now"]
        assert 500_000 < row["at"] - now <= 600_000
        assert (
            http.get("/api/crawls/slow/delayed", params={"class": "gone"}).json()["entries"] == []
        )
        page = http.get(f"/crawls/slow/delayed/{entry_id}").text
        assert page.count("HTTP 503") >= 2 and "s3cr3t" not in page


@deferred_f_from_coro_f
async def test_requeue_all_that_match_the_tables_filter_from_the_form(redis_url, site):
    await crawl(redis_url, site, paths=PATHS)
    with dashboard(redis_url) as http:
        csrf = form_token(http.get("/crawls/faults/dead").text)
        form = {"csrf": csrf, "scope": "filter", "class": "gone"}
        confirm = http.post("/crawls/faults/actions/requeue", data=form)
        assert "Requeue 2 entries of faults?" in confirm.text
        listed = re.search(r'name="selection" value="([^"]*)"', confirm.text)
        assert listed is not None and len(listed.group(1).split()) == 2  # what it will take
        confirmed = {"csrf": csrf, "selection": listed.group(1), "confirm": "yes"}
        done = http.post("/crawls/faults/actions/requeue", data=confirmed)
        assert "Requeued 2 of 2 entries." in done.text
        left = http.get("/api/crawls/faults/dead").json()["entries"]
        assert [e["class"] for e in left] == ["server"]
        assert http.get("/api/crawls/faults").json()["pending"] == 2


@deferred_f_from_coro_f
async def test_retry_now_makes_a_delayed_retry_due_and_pause_resume_say_what_changed(redis_url):
    entry_id = await delay_one(redis_url, "http://shop.example/item/8", 600_000)
    with dashboard(redis_url) as http:
        act = "/api/crawls/slow/actions/"
        done = http.post(act + "retry-now", json={"ids": [entry_id, "no-such-id"]}).json()
        assert done["touched"] == 1 and done["report"] == (
            "made due now 1 of 2 entries; 1 was not delayed any more (a worker took it already, "
            "or no such entry)"
        )
        (row,) = http.get("/api/crawls/slow/delayed").json()["entries"]
        assert row["at"] <= http.get("/api/crawls/slow").json()["now"]

        assert http.post(act + "pause", json={}).json()["report"] == "paused"
        assert http.get("/api/crawls/slow").json()["paused"] is True
        assert http.post(act + "pause", json={}).json()["report"] == "was paused already"
        assert "paused" in http.get("/crawls/slow").text
        assert "none while paused" in http.get("/crawls/slow").text  # no ETA: nothing moves
        assert http.get("/api/crawls/slow").json()["eta_s"] is None
        assert http.post(act + "resume", json={}).json()["report"] == "resumed"
        assert http.get("/api/crawls").json()["crawls"][0]["paused"] is False


def test_a_rare_filter_stops_after_its_scan_limit_and_the_cursor_goes_on(redis_client, monkeypatch):
    monkeypatch.setattr(_tables, "SCAN_LIMIT", 1)  # one batch per page
    monkeypatch.setattr(_tables, "BATCH", 1000)
    seed_dead(redis_client, 3000)
    with dashboard(_url(redis_client)) as http:
        params = {"class": "rare", "size": 50}
        first = http.get("/api/crawls/big/dead", params=params).json()
        assert (len(first["entries"]), first["scanned"]) == (10, 1000)
        assert first["next_cursor"].endswith(_hex("1999"))  # the entry it goes on from
        params["cursor"] = first["next_cursor"]
        second = http.get("/api/crawls/big/dead", params=params).json()
        assert second["entries"][0]["id"] == "1900" and second["next_cursor"].endswith(_hex("999"))


#: Secret query parameters in the spellings APIs use (issue 36 item 2).
CAMEL = ("accessToken", "apiToken", "clientSecret", "secretKey", "authToken", "privateKey")


@deferred_f_from_coro_f
async def test_secret_parameters_in_any_spelling_are_masked_on_every_page(redis_url, site):
    query = "&".join(f"{name}=camel-S{n}" for n, name in enumerate(CAMEL))
    await crawl(redis_url, site, paths=(f"/status/404?{query}&page=2",))
    with dashboard(redis_url) as http:
        (entry,) = http.get("/api/crawls/faults/dead").json()["entries"]
        pages = [
            "/crawls/faults/dead",
            f"/crawls/faults/dead/{entry['id']}",
            "/api/crawls/faults/dead",
            f"/api/crawls/faults/dead/{entry['id']}",
        ]
        for page in pages:
            text = http.get(page).text
            assert "camel-S" not in text, f"{page} shows a secret parameter"
        shown = http.get(f"/api/crawls/faults/dead/{entry['id']}").json()
    masked = "&".join(f"{name}=***" for name in CAMEL)
    assert shown["url"].endswith(f"?{masked}&page=2") and shown["request"]["u"] == shown["url"]


class BodySecretsSpider(scrapy.Spider):
    """Logs in with a form and with JSON, to pages that are gone (issue 36 item 5)."""

    name = "bodysecrets"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base_url = base_url

    async def start(self) -> Any:
        yield FormRequest(
            f"{self.base_url}/status/404?form",
            formdata={"user": "u", "password": "form-S1"},
            errback=self.on_error,
        )
        yield JsonRequest(
            f"{self.base_url}/status/404?json",
            data={"user": "u", "password": "json-S2", "auth": {"apiKey": "json-S3"}},
            errback=self.on_error,
        )

    def on_error(self, failure: Any) -> None:
        pass


# Scrapy 2.16 warns FormRequest deprecated (2.19 only its from_response): users of 2.16 have it
@pytest.mark.filterwarnings("ignore:scrapy.http.FormRequest is deprecated")
@deferred_f_from_coro_f
async def test_secret_fields_of_form_and_json_bodies_are_masked(redis_url, site):
    await crawl(redis_url, site, BodySecretsSpider)
    secrets = ("form-S1", "json-S2", "json-S3")
    with dashboard(redis_url) as http:
        entries = http.get("/api/crawls/bodysecrets/dead").json()["entries"]
        assert len(entries) == 2
        bodies = {}
        for entry in entries:
            pages = [f"/crawls/bodysecrets/dead/{entry['id']}"]
            pages.append(f"/api/crawls/bodysecrets/dead/{entry['id']}")
            for page in pages:
                text = http.get(page).text
                assert not [s for s in secrets if s in text], f"{page} shows a body secret"
            answer = http.get(f"/api/crawls/bodysecrets/dead/{entry['id']}").json()
            bodies[entry["url"].rsplit("?", 1)[1]] = answer["body"]
            show = subprocess.run(
                [SCRAPY_HA, "--redis-url", redis_url, "dlq", "show", "bodysecrets", entry["id"]],
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout
            assert not [s for s in secrets if s in show], f"dlq show prints a body secret: {show}"
    assert bodies["form"] == "user=u&password=***"
    assert json.loads(bodies["json"]) == {"user": "u", "password": "***", "auth": "***"}


def test_a_crawl_that_is_not_in_redis_is_a_404_everywhere_and_no_action_makes_it(
    redis_url, redis_client
):
    """A mistyped spider name: its tables answered empty, and a pause made the crawl (its
    key written, the crawl listed since)."""
    with dashboard(redis_url) as http:
        for path in (
            "/api/crawls/nosuch/dead",
            "/api/crawls/nosuch/delayed",
            "/crawls/nosuch/dead",
        ):
            answer = http.get(path)
            assert answer.status_code == 404 and "no such crawl" in answer.text, path
        for action, body in (("pause", {}), ("resume", {}), ("requeue", {"ids": ["1"]})):
            answer = http.post(f"/api/crawls/nosuch/actions/{action}", json=body)
            assert answer.status_code == 404 and "no such crawl" in answer.text, action
        assert http.get("/api/crawls").json()["crawls"] == []
        page = http.get("/crawls/nosuch")  # a page's error is a line of text, not JSON
        assert page.status_code == 404 and page.text.startswith("error: no such crawl"), page.text
        assert http.get("/api/crawls/nosuch").json()["detail"].startswith("no such crawl")
    assert redis_client.keys("ha:{nosuch}*") == []
    redis_client.set("ha:{odd}:finish", "done")  # a key the overview lists, no queue key
    with dashboard(redis_url) as http:
        assert http.get("/api/crawls").status_code == 200  # (a 404, once)
        assert http.get("/").status_code == 200
