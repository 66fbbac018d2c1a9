"""The dashboard refuses what a page of another origin makes a browser send: a POST from
another origin (another site, ``null``, another port of 127.0.0.1), and a form token made
up from a CSRF cookie such a page can set. FastAPI's TestClient on a real Redis; the same
attack from a real page in Chromium is in tests/test_dashboard_browser.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from scrapy_ha.dashboard._guard import CSRF_COOKIE
from scrapy_ha.keys import Keys
from tests.test_dashboard_api import dashboard
from tests.test_dashboard_api import form_token as token_in

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

#: The crawl the forms act on (its page answers 404 while the crawl has no key in Redis).
PAUSED = Keys("ha", "shop").paused
PAUSE = "/crawls/shop/actions/pause"
#: Where the TestClient's requests go (the dashboard's own origin).
OWN = "http://127.0.0.1"


@pytest.fixture(autouse=True)
def shop(redis_client: Any) -> None:
    """The crawl ``shop``, as a worker's first enqueue leaves it."""
    redis_client.hset(Keys("ha", "shop").stats, "enqueued", 1)


def form_token(http: TestClient) -> str:
    """The CSRF token the crawl page's pause form carries."""
    page = http.get("/crawls/shop")
    assert page.status_code == 200, page.text
    return token_in(page.text)


def pause(http: TestClient, csrf: str, **headers: str) -> Any:
    return http.post(PAUSE, data={"csrf": csrf, "confirm": "yes"}, headers=headers)


#: What a browser sends with a POST a page of another origin makes.
FOREIGN = [
    {"Origin": "http://evil.example"},
    {"Origin": "null"},  # a sandboxed frame, a data: URL, Referrer-Policy: no-referrer
    {"Origin": "http://127.0.0.1:8000"},  # another port of this host: same site
    {"Origin": "https://127.0.0.1"},  # another scheme
    {"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:8000"},
    {"Sec-Fetch-Site": "cross-site", "Origin": "http://evil.example"},
    {"Referer": "http://127.0.0.1:8000/attack.html"},  # an old browser: no Origin
]


@pytest.mark.parametrize("headers", FOREIGN, ids=lambda h: " ".join(h.values()))
def test_a_post_from_another_origin_is_refused_before_anything_runs(
    redis_url, redis_client, headers
):
    with dashboard(redis_url) as http:
        csrf = form_token(http)  # even with the right token
        refused = pause(http, csrf, **headers)
        assert refused.status_code == 403, refused.text
        assert "another origin" in refused.json()["error"]
        assert not redis_client.exists(PAUSED)
        api = http.post("/api/crawls/shop/actions/pause", json={}, headers=headers)
        assert api.status_code == 403 and not redis_client.exists(PAUSED)
        login = http.post("/login", data={"token": "t", "next": "/"}, headers=headers)
        assert login.status_code == 403


#: What a browser sends with a POST a page of the dashboard makes (or a script, nothing).
OWN_POSTS = [
    {"Sec-Fetch-Site": "same-origin", "Origin": OWN},
    {"Origin": OWN},
    {"Origin": OWN.upper()},  # origins compare case-insensitively
    {"Referer": f"{OWN}/crawls/shop"},
    {},  # curl: no browser made it
]


@pytest.mark.parametrize("headers", OWN_POSTS, ids=lambda h: " ".join(h.values()) or "none")
def test_a_post_from_the_dashboards_own_pages_runs(redis_url, redis_client, headers):
    with dashboard(redis_url) as http:
        done = pause(http, form_token(http), **headers)
        assert done.status_code == 200 and "Paused." in done.text
        assert redis_client.exists(PAUSED)


def test_a_csrf_cookie_set_by_another_page_makes_no_form_token(redis_url, redis_client):
    """Cookies do not tell ports apart: a page on another port of 127.0.0.1 can set the
    dashboard's CSRF cookie. The form token is an HMAC of it under the server's secret."""
    with dashboard(redis_url) as http:
        http.cookies.set(CSRF_COOKIE, "EVIL")
        assert pause(http, "EVIL").status_code == 403  # the cookie's value is no token
        assert not redis_client.exists(PAUSED)
        token = form_token(http)
        assert http.cookies[CSRF_COOKIE] == "EVIL" and token != "EVIL"
        http.cookies.set(CSRF_COOKIE, "EVIL2")
        assert form_token(http) != token  # bound to the cookie it was made for
        assert pause(http, token).status_code == 403
        assert not redis_client.exists(PAUSED)
        with dashboard(redis_url) as other:  # another dashboard process: another secret
            other.cookies.set(CSRF_COOKIE, "EVIL2")
            assert pause(other, form_token(http)).status_code == 403
        assert not redis_client.exists(PAUSED)
        assert pause(http, form_token(http)).status_code == 200  # its own token works
        assert redis_client.exists(PAUSED)
