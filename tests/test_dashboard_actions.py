"""The dashboard's actions touch exactly the entries asked for: the JSON API takes ids as a
list of strings and refuses anything else, an id of a shard the crawl does not have is not
found (not a 500), and a form action over a filter touches the entries its confirmation
page listed, not those that matched later. FastAPI's TestClient over a real Redis written
by the queue's own scripts."""

from __future__ import annotations

import asyncio
import html
import re
from typing import TYPE_CHECKING, Any

import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.store.sharding import check_shard_count, make_queue
from tests.test_dashboard_api import dashboard, form_token, seed_dead
from tests.test_dashboard_pages import entry

if TYPE_CHECKING:
    from fastapi.testclient import TestClient


async def dead_letters(
    url: str, spider: str, n: int, shards: int = 1, first: int = 0, **info: Any
) -> None:
    """*n* dead letters of *spider*, its URLs numbered from *first* (class ``gone`` unless
    *info* says otherwise)."""
    client = redis.asyncio.Redis.from_url(url)
    q = make_queue(client, "ha", spider, shards)
    await check_shard_count(q)
    urls = [f"http://{spider}.example/{spider}/{i}" for i in range(first, first + n)]
    await q.sync(enqueue=[entry(u) for u in urls])
    for x in (await q.sync(lease=n, lease_ms=600_000)).leases:
        await q.dead_letter(x.id, x.token, {"class": "gone", "reason": "HTTP 404", **info})
    await client.aclose()


def dead_ids(http: TestClient, spider: str) -> set[str]:
    page = http.get(f"/api/crawls/{spider}/dead", params={"size": 500}).json()
    assert page["next_cursor"] is None
    return {e["id"] for e in page["entries"]}


@deferred_f_from_coro_f
async def test_the_api_takes_ids_as_a_list_of_strings_and_refuses_anything_else(redis_url):
    await dead_letters(redis_url, "wide", 30, shards=3)

    def check(http: TestClient) -> None:
        before = dead_ids(http, "wide")
        one = sorted(i for i in before if i.startswith("1:"))[0]  # an entry of shard 1
        assert {"1", one.partition(":")[2]} <= before  # its characters name other entries
        url = "/api/crawls/wide/actions/requeue"
        for body in ({"ids": one}, {"ids": [int(one[2:])]}, {"ids": {"a": one}}, [one]):
            refused = http.post(url, json=body)
            assert refused.status_code == 400, body
            assert "ids" in refused.json()["detail"] or "object" in refused.json()["detail"]
        assert http.post(url, json={"filter": "gone"}).status_code == 400
        assert dead_ids(http, "wide") == before  # nothing was touched
        done = http.post(url, json={"ids": [one]}).json()
        assert done["touched"] == 1 and dead_ids(http, "wide") == before - {one}

    await asyncio.to_thread(_drive, redis_url, check)


@deferred_f_from_coro_f
async def test_a_filter_the_api_cannot_read_is_refused_not_taken_for_every_entry(redis_url):
    await dead_letters(redis_url, "mixed", 4)
    await dead_letters(redis_url, "mixed", 3, first=4, **{"class": "server"})

    def check(http: TestClient) -> None:
        before = dead_ids(http, "mixed")
        url = "/api/crawls/mixed/actions/purge"
        for body in (
            {"filter": {"failure_class": "gone"}},  # the attribute's name, not the field's
            {"filter": {"class": "gone", "klass": "x"}},
            {"filter": {"since": 5}},
            {"filter": {"domain": 5}},
            {"filter": {"class": "gone"}, "dry_run": "no"},
            # before: each took every entry (a script's unset variable purged the queue)
            {"filter": {}},
            {"filter": {"class": ""}},
            {"filter": {"class": None}},
            {"filter": {"status": " "}},
            {"filter": {}, "all": "yes"},
            # a QA run: a field the body has not was passed over (a typo of "dry_run"
            # purged them for real; {"x": 1} paused a crawl)
            {"filter": {"class": "gone"}, "dryrun": True},
        ):
            refused = http.post(url, json=body)
            assert refused.status_code == 400, (body, refused.text)
        assert dead_ids(http, "mixed") == before  # nothing was touched
        paused = http.post("/api/crawls/mixed/actions/pause", json={"x": 1})
        assert paused.status_code == 400, paused.text
        assert "the body has no field 'x'" in paused.text
        assert not http.get("/api/crawls/mixed").json()["paused"]
        dry = http.post(url, json={"filter": {"class": "gone"}, "dry_run": True}).json()
        assert dry["selected"] == 4 and dead_ids(http, "mixed") == before
        every = http.post(url, json={"filter": {}, "all": True, "dry_run": True}).json()
        assert every["selected"] == 7

    await asyncio.to_thread(_drive, redis_url, check)


@deferred_f_from_coro_f
async def test_an_id_of_a_shard_the_crawl_does_not_have_is_not_found(redis_url):
    await dead_letters(redis_url, "wide", 12, shards=3)

    def check(http: TestClient) -> None:
        before = dead_ids(http, "wide")
        for action in ("purge", "requeue"):
            done = http.post(f"/api/crawls/wide/actions/{action}", json={"ids": ["9:1"]})
            assert done.status_code == 200, done.text
            assert done.json()["touched"] == 0
        assert http.get("/crawls/wide/dead/9:1").status_code == 404
        assert dead_ids(http, "wide") == before

    await asyncio.to_thread(_drive, redis_url, check)


@deferred_f_from_coro_f
async def test_a_dry_run_of_ids_counts_those_the_action_would_touch(redis_url):
    await dead_letters(redis_url, "wide", 12, shards=3)

    def check(http: TestClient) -> None:
        before = dead_ids(http, "wide")
        one, other = sorted(before)[:2]
        url = "/api/crawls/wide/actions/purge"
        # before: "selected" counted the ids given, those the crawl never had included
        body = {"ids": [one, other, "9:1", "999999", one], "dry_run": True}
        dry = http.post(url, json=body).json()
        assert dry == {
            "action": "purge",
            "dry_run": True,
            "selected": 2,
            "missing": 2,
            "touched": 0,
        }, dry
        assert dead_ids(http, "wide") == before
        done = http.post(url, json={"ids": [one, other, "9:1", "999999"]}).json()
        assert done["touched"] == 2

    await asyncio.to_thread(_drive, redis_url, check)


def confirm_form(page: str) -> dict[str, str | list[str]]:
    """The fields the confirmation page's form posts (its hidden inputs), as a browser
    would post them."""
    form = re.search(r'<form method="post"[^>]*class="confirm">(.*?)</form>', page, re.S)
    assert form is not None, page
    fields: dict[str, list[str]] = {}
    for name, value in re.findall(r'name="([^"]+)" value="([^"]*)"', form.group(1)):
        fields.setdefault(name, []).append(html.unescape(value))
    return {k: v[0] if len(v) == 1 else v for k, v in fields.items()}


@deferred_f_from_coro_f
async def test_a_filter_action_touches_the_entries_its_confirmation_listed(redis_url):
    await dead_letters(redis_url, "shop", 3, shards=2, **{"class": "banned"})

    def check(http: TestClient) -> None:
        listed = dead_ids(http, "shop")
        csrf = form_token(http.get("/crawls/shop/dead").text)
        form = {"csrf": csrf, "scope": "filter", "class": "banned"}
        confirm = http.post("/crawls/shop/actions/purge", data=form)
        assert "Purge 3 entries of shop?" in confirm.text
        # meanwhile a worker dead-letters two more banned requests
        asyncio.run(dead_letters(redis_url, "shop", 2, shards=2, first=3, **{"class": "banned"}))
        assert len(dead_ids(http, "shop")) == 5
        done = http.post("/crawls/shop/actions/purge", data=confirm_form(confirm.text))
        assert "Purged 3 of 3 entries." in done.text, done.text
        assert not dead_ids(http, "shop") & listed and len(dead_ids(http, "shop")) == 2
        # a confirmation that names no entries (a filter alone) is refused, not recomputed
        again = http.post("/crawls/shop/actions/purge", data={**form, "confirm": "yes"})
        assert again.status_code == 400 and len(dead_ids(http, "shop")) == 2

    await asyncio.to_thread(_drive, redis_url, check)


def test_a_page_size_below_1_reads_one_row_and_its_cursor_moves_on(redis_client):
    seed_dead(redis_client, 3, spider="few")
    kw = redis_client.connection_pool.connection_kwargs
    with dashboard(f"redis://{kw['host']}:{kw['port']}/{kw['db']}") as http:
        seen, cursor = [], None
        for _ in range(5):
            params = {"size": -5, **({"cursor": cursor} if cursor is not None else {})}
            page = http.get("/api/crawls/few/dead", params=params).json()
            assert len(page["entries"]) == 1, page
            seen += [e["id"] for e in page["entries"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == ["2", "1", "0"]


def _drive(redis_url: str, check: Any) -> None:
    with dashboard(redis_url) as http:
        check(http)


@deferred_f_from_coro_f
async def test_every_link_of_an_action_s_report_leads_to_a_page(redis_url):
    await dead_letters(redis_url, "shop", 1)

    def check(http: TestClient) -> None:
        csrf = form_token(http.get("/crawls/shop").text)
        for name, ids in (("open-gate", ["shop.example"]), ("purge", ["0"]), ("pause", [])):
            form = {"csrf": csrf, "confirm": "yes", "ids": ids}
            done = http.post(f"/crawls/shop/actions/{name}", data=form)
            assert done.status_code == 200, done.text
            links = re.findall(r"<main>.*?</main>", done.text, re.S)[0]
            for href in re.findall(r'href="(/crawls/[^"]*)"', links):
                # before: the open-gate report's "back to the table" led to a 404
                assert http.get(href).status_code == 200, (name, href)

    await asyncio.to_thread(_drive, redis_url, check)


@deferred_f_from_coro_f
async def test_the_address_of_an_action_s_report_opened_again_leads_back(redis_url):
    await dead_letters(redis_url, "shop", 1)

    def check(http: TestClient) -> None:
        # the address bar of a report, entered again (or a tab restored): a GET; before, a
        # 404 "no table 'actions': dead or delayed"
        for name, back in (("requeue", "/crawls/shop/dead"), ("pause", "/crawls/shop")):
            again = http.get(f"/crawls/shop/actions/{name}")
            assert again.status_code == 303, again.text
            assert again.headers["location"] == back
        assert dead_ids(http, "shop")  # nothing done
        assert http.get("/crawls/shop/actions/nope").status_code == 404

    await asyncio.to_thread(_drive, redis_url, check)
