"""The dashboard in a real browser: Debian's headless chromium, driven by Playwright, on a
real `scrapy-ha dashboard` process over a real Redis holding a real crawl's dead letters,
and over a live crawl whose site closed its gate with a 429.

Screenshots of every page go to ``.artifacts/dashboard/`` (git-ignored; CI keeps them);
with ``HA_DOCS_SCREENSHOTS=1`` (``make screenshots``) the pages the README and
docs/dashboard.md show are written to ``docs/img/`` too.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from scrapy.core.engine import ExecutionEngine
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.demo import harness
from scrapy_ha.keys import Keys
from tests import backqueues
from tests.test_crash import count_lines, wait_for_items, worker
from tests.test_dashboard_api import PATHS, SCRAPY_HA, crawl

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path as PathT

pytestmark = pytest.mark.browser

#: Debian's chromium (Makefile DEBIAN_PACKAGES): Playwright downloads no browser of its own.
CHROMIUM = "/usr/bin/chromium"
#: Where the screenshots go.
ARTIFACTS = Path(__file__).resolve().parent.parent / ".artifacts" / "dashboard"
#: The screenshots the docs show, refreshed with HA_DOCS_SCREENSHOTS=1: name -> docs/img file.
DOCS = Path(__file__).resolve().parent.parent / "docs" / "img"
FOR_DOCS = {
    "live-overview": "dashboard-overview.png",
    "live-crawl": "dashboard-crawl.png",
    "live-delayed-retry": "dashboard-delayed-retry.png",
    "dead-letters": "dashboard-dead-letters.png",
    "entry": "dashboard-entry.png",
}
#: Seconds a page gets to load or a step to show its result (a loaded 2-core machine).
STEP_TIMEOUT_MS = 30_000


@pytest.fixture(autouse=True)
def fast_engine_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ExecutionEngine, "_SLOT_HEARTBEAT_INTERVAL", 0.2)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@pytest.fixture
def dashboard_url(redis_url: str) -> Iterator[str]:
    """`scrapy-ha dashboard` as a user starts it, on a free port."""
    port = harness.free_port()
    proc = harness.spawn(
        [SCRAPY_HA, "--redis-url", redis_url, "dashboard", "--port", str(port)],
    )
    url = f"http://127.0.0.1:{port}"
    try:
        harness.wait_for(lambda: answers(url + "/api/crawls"), "the dashboard", 60)
        yield url
    finally:
        harness.stop(proc)


def in_thread(func: Callable[[], Any]) -> None:
    """Run *func* in a thread of its own (Playwright's sync API refuses a thread whose
    asyncio loop runs: the reactor's) and raise what it raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            func()
        except BaseException as exc:  # handed to the test
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    if os.environ.get("HA_DOCS_SCREENSHOTS") and name in FOR_DOCS:
        shutil.copyfile(path, DOCS / FOR_DOCS[name])


def drive(url: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.set_default_timeout(STEP_TIMEOUT_MS)
        expect.set_options(timeout=STEP_TIMEOUT_MS)

        page.goto(url + "/")
        row = page.locator("[data-spider=faults]")
        expect(row).to_be_visible()
        expect(row.locator("svg polyline")).to_have_count(1)
        expect(row.locator(".progress-text")).to_contain_text("4 of 4 requests finished")
        shot(page, "overview")

        row.get_by_role("link", name="faults").click()
        expect(page.locator("h1")).to_contain_text("faults")
        expect(page.locator("#pending")).to_have_text("0")
        shot(page, "crawl")

        page.goto(url + "/crawls/faults/dead")
        expect(page.locator("tr[data-id]")).to_have_count(3)
        page.get_by_label("Class").fill("gone")
        page.get_by_role("button", name="Filter").click()
        rows = page.locator("tr[data-id]")
        expect(rows).to_have_count(2)
        expect(rows.locator("td.cls")).to_have_text(["Gone", "Gone"])
        shot(page, "dead-letters")

        chosen = rows.first.get_attribute("data-id")
        rows.first.locator("input[name=ids]").check()
        page.get_by_role("button", name="Requeue selected").click()
        expect(page.locator("h1")).to_have_text("Requeue 1 entry of faults?")
        expect(page.locator("ul.confirm-list")).to_contain_text("http://127.0.0.1")  # a URL
        apart(page.locator("form.confirm .buttons > *"))
        shot(page, "confirm")
        page.locator("#confirm").click()
        expect(page.locator("#report")).to_have_text("Requeued 1 of 1 entry.")
        shot(page, "done")

        page.goto(url + "/crawls/faults/dead?class=gone")
        expect(page.locator("tr[data-id]")).to_have_count(1)
        expect(page.locator(f"tr[data-id='{chosen}']")).to_have_count(0)
        page.goto(url + "/crawls/faults")
        expect(page.locator("#pending")).to_have_text("1")

        page.goto(url + "/crawls/faults/dead?class=server")
        page.locator("td.url a").first.click()
        expect(page.locator("table.history tbody tr")).to_have_count(3)
        expect(page.locator("h1")).to_contain_text("GET http://127.0.0.1")
        expect(page.locator("#stored")).to_be_hidden()  # the stored form: behind a toggle
        apart(page.locator("form.actions button"))
        shot(page, "entry")
        page.get_by_text("The stored form").click()
        expect(page.locator("#stored")).to_be_visible()
        shot(page, "entry-stored")

        page.goto(url + "/crawls/faults/delayed")
        expect(page.locator("h1")).to_contain_text("Delayed")
        shot(page, "delayed")
        pause_and_see_it(page, url)
        read_without_javascript(browser, url)
        browser.close()


#: Pixels between two buttons side by side, at least: they must not touch.
BUTTON_GAP = 4


def apart(buttons: Any) -> None:
    """The buttons of *buttons*, left to right, do not touch."""
    boxes = sorted((b.bounding_box() for b in buttons.all()), key=lambda box: box["x"])
    assert len(boxes) >= 2, boxes
    for left, right in zip(boxes, boxes[1:], strict=False):
        assert right["x"] - (left["x"] + left["width"]) >= BUTTON_GAP, (left, right)


def pause_and_see_it(page: Any, url: str) -> None:
    from playwright.sync_api import expect

    page.goto(url + "/crawls/faults")
    page.get_by_role("button", name="Pause this crawl").click()
    page.locator("#confirm").click()
    expect(page.locator("#report")).to_have_text("Paused.")
    page.goto(url + "/crawls/faults")
    expect(page.locator("#state")).to_have_text("paused")
    page.goto(url + "/")
    expect(page.locator("[data-spider=faults] [data-state]")).to_have_text("paused")
    shot(page, "overview-paused")


def read_without_javascript(browser: Any, url: str) -> None:
    """Filtering and paging are links and GET forms: they work with JavaScript off."""
    from playwright.sync_api import expect

    page = browser.new_context(java_script_enabled=False).new_page()
    page.goto(url + "/crawls/faults/dead")
    page.get_by_label("Class").fill("server")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("tr[data-id] td.cls")).to_have_text(["Server error"])
    page.goto(url + "/crawls/faults")  # a live page is a plain page that reloads itself
    expect(page.locator("#pending")).to_have_text("1")  # the one requeued
    assert 'http-equiv="refresh"' in page.content()


@deferred_f_from_coro_f
async def test_filter_requeue_and_see_it_pending_in_chromium(redis_url, site, dashboard_url):
    await crawl(redis_url, site, paths=PATHS)
    in_thread(lambda: drive(dashboard_url))


#: A catalogue whose 25th item answers 429 with Retry-After 300 s once: the gate of
#: 127.0.0.1 closes for every worker, and the requests behind it wait without an attempt
#: in the host's queue in Redis (the crawl cannot end before it opens); every 7th item fails
#: twice with a 503 first.
GATED_SITE = ("--pages", "12", "--per-page", "10", "--delay", "0.05")
GATED_FAULTS = ("--fault", "429:25:1:300", "--fault", "503:7:2")


def gated(redis_client: Any) -> bool:
    """Requests wait behind the gate in their host's queue in Redis (parked in ``waiting``
    until it opens), the worker holds no lease (none kept in its buffer for the host), and
    the 503s' retries have come due and joined them: the one retry delayed is the 429's.
    (A request the worker held when the gate closed, a matter of timing, is delayed too,
    deferred without an attempt: marked in ``held``, not a retry.)"""
    keys = Keys("ha", "catalogue")
    qids = [q.decode() for q in redis_client.zrange(keys.waiting, 0, -1)]
    behind = sum(redis_client.llen(keys.queue(q)) for q in qids if q.endswith(":127.0.0.1"))
    held = redis_client.hgetall(keys.held)
    deferred = sum(int(n) for mark, n in held.items() if mark.startswith(b"#"))
    retries = redis_client.zcard(keys.delayed) - deferred
    return behind >= 5 and redis_client.zcard(keys.leased) == 0 and retries == 1


def read_live_crawl(url: str) -> None:
    """The overview, the crawl page and the delayed table of a crawl held at a closed gate:
    what waits and why, the ETA past the gate, the numbers refreshed in place, and the
    request the site answered with the 429, due when the gate opens."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.set_default_timeout(STEP_TIMEOUT_MS)
        expect.set_options(timeout=STEP_TIMEOUT_MS)

        page.goto(url + "/")
        card = page.locator("[data-spider=catalogue]")
        expect(card.locator("[data-state]")).to_have_text("running")
        expect(card.locator("ul.why")).to_contain_text("waiting for the gate of 127.0.0.1")
        expect(card.locator("[data-field=eta]")).to_contain_text("m")  # minutes: past the gate
        expect(card.locator("svg.chart text.unit")).to_have_text("pages/s")
        shot(page, "live-overview")

        page.goto(url + "/crawls/catalogue")
        expect(page.locator("table.waiting tr.gate")).to_have_count(1)  # the gate, once
        expect(page.locator("table.waiting")).to_contain_text("gate closed (HTTP 429)")
        expect(page.locator("#pending-retries")).not_to_have_text("")
        expect(page.locator("figure.chart-box")).to_have_count(3)
        # live: the sections are replaced in place, the page is not reloaded
        page.evaluate("window.notReloaded = true")
        old = page.locator("#summary").element_handle()
        expect(page.locator("#live-text")).to_contain_text("live ·")
        assert page.evaluate("window.notReloaded") is True
        assert old is not None and page.evaluate("(el) => !el.isConnected", old)
        shot(page, "live-crawl")

        page.goto(url + "/crawls/catalogue/delayed?class=rate_limited")
        rows = page.locator("tr[data-id]")
        expect(rows.first.locator("td.cls")).to_have_text("Rate-limited")
        expect(rows.first).to_contain_text("HTTP 429")
        shot(page, "live-delayed-retry")
        browser.close()


def test_an_operator_reads_a_crawl_held_at_a_closed_gate(
    redis_url, redis_client, site_factory, tmp_path: PathT, dashboard_url: str
):
    site = site_factory(*GATED_SITE, *GATED_FAULTS)
    items, log = tmp_path / "items.jl", tmp_path / "worker.log"
    live = worker(redis_url, site.url, items, log)
    try:
        harness.wait_for(lambda: gated(redis_client), "requests waiting behind the gate", 120)
        assert live.poll() is None, log.read_text()[-3000:]
        in_thread(lambda: read_live_crawl(dashboard_url))
    finally:
        live.send_signal(signal.SIGINT)  # hands its leases back: the crawl stays as it is
        try:
            live.wait(60)
        except subprocess.TimeoutExpired:
            live.kill()


def heartbeat(redis_client: Any) -> float:
    rows = redis_client.zrange("ha:{catalogue}:workers", 0, 0, withscores=True)
    return float(rows[0][1]) if rows else 0.0


def click_through(url: str, button: str, report: str) -> None:
    """On the crawl page: *button*, confirm, and see *report*."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.set_default_timeout(STEP_TIMEOUT_MS)
        page.goto(url + "/crawls/catalogue")
        page.get_by_role("button", name=button).click()
        page.locator("#confirm").click()
        expect(page.locator("#report")).to_have_text(report, timeout=STEP_TIMEOUT_MS)
        page.goto(url + "/crawls/catalogue")
        shot(page, f"crawl-{report.rstrip('.').lower()}")
        browser.close()


#: A catalogue a worker takes some seconds over (paused after its first 20 items).
PAGES, PER_PAGE = 20, 10


def test_pause_from_the_dashboard_stops_a_live_worker_leasing(
    redis_url, redis_client, site_factory, tmp_path: PathT, dashboard_url: str
):
    site = site_factory("--pages", str(PAGES), "--per-page", str(PER_PAGE), "--delay", "0.2")
    items, log = tmp_path / "items.jl", tmp_path / "worker.log"
    live = worker(redis_url, site.url, items, log)
    try:
        wait_for_items(items, 20, live)
        in_thread(lambda: click_through(dashboard_url, "Pause this crawl", "Paused."))
        harness.wait_for(
            lambda: redis_client.zcard("ha:{catalogue}:leased") == 0, "its leases done", 60
        )
        held = count_lines(items)
        for _ in range(2):  # alive, renewing, leasing nothing
            before = heartbeat(redis_client)
            harness.wait_for(lambda b=before: heartbeat(redis_client) > b, "a heartbeat", 30)
            assert live.poll() is None
        assert (
            count_lines(items) == held
            and backqueues.count(redis_client, Keys("ha", "catalogue")) > 0
        )
        in_thread(lambda: click_through(dashboard_url, "Resume this crawl", "Resumed."))
        assert live.wait(120) == 0
    finally:
        if live.poll() is None:
            live.kill()
    assert count_lines(items) == PAGES * PER_PAGE


#: A page of another port of 127.0.0.1 (same site, another origin): it sets the dashboard's
#: CSRF cookie (cookies do not tell ports apart) and posts the pause form with it at once.
ATTACK = """<!doctype html><title>attack</title>
<script>document.cookie = "ha_dashboard_csrf=EVIL; path=/; SameSite=Strict";</script>
<form id="f" method="post" action="{dashboard}/crawls/shop/actions/pause">
<input name="csrf" value="EVIL"><input name="confirm" value="yes"></form>
<script>document.getElementById("f").submit();</script>"""


@pytest.fixture
def attack_url(dashboard_url: str) -> Iterator[str]:
    """The attack page, served on another port of 127.0.0.1."""
    page = ATTACK.format(dashboard=dashboard_url).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", harness.free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/attack.html"
    finally:
        server.shutdown()
        server.server_close()


def attack(url: str, dashboard_url: str) -> tuple[str, list[dict[str, Any]]]:
    """Open the attack page; return what the dashboard answered its POST, and the cookies."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        context = browser.new_context()
        page = context.new_page()
        page.set_default_timeout(STEP_TIMEOUT_MS)
        page.goto(url)
        page.wait_for_url(dashboard_url + "/crawls/shop/actions/pause")
        shot(page, "attack-from-another-port")
        answer, cookies = page.content(), context.cookies()
        browser.close()
        return answer, list(cookies)


def test_a_page_on_another_port_cannot_pause_a_crawl_with_a_cookie_it_set(
    redis_client, dashboard_url: str, attack_url: str
):
    found: list[tuple[str, list[dict[str, Any]]]] = []
    in_thread(lambda: found.append(attack(attack_url, dashboard_url)))
    ((answer, cookies),) = found
    # the attack was real: the browser sent the planted cookie to the dashboard
    assert {(c["name"], c["value"]) for c in cookies} >= {("ha_dashboard_csrf", "EVIL")}
    assert "another origin" in answer
    assert not redis_client.exists("ha:{shop}:paused")
