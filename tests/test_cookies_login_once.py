"""One login per expiry of a shared cookie session (``scrapy_ha.cookies.login_once``).

A spider that logs in again wherever it meets the login form logged in once per request in
flight at each expiry, on every worker (a QA crawl: 117 logins for about 5 expiries with 3
workers). With ``login_once`` one request logs in and the others wait for its answer.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import pytest
import redis
import redis.asyncio
from scrapy import Request
from scrapy.http import HtmlResponse
from scrapy.http.cookies import CookieJar
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha import metakeys
from scrapy_ha.cookies import LoginFailed, login_once
from scrapy_ha.keys import Keys
from scrapy_ha.middlewares.logins import MAX_LOGINS_MET, _again, _logins_met
from scrapy_ha.store.jars import SharedJars, login_epoch, snapshot
from tests.cli_seed import _run, dead_letters, scrapy_ha
from tests.scrapy_project import crawl, write_project

if TYPE_CHECKING:
    from pathlib import Path

PAGES = 240
#: The site ends every session after this many pages answered.
EXPIRE_EVERY = 60
#: How each worker logs in: with a request, or with a function of its own steps.
LOGINS = ("request", "function")


class _Site:
    """Pages that need a session; every EXPIRE_EVERY pages answered, every session ends."""

    def __init__(self, *, anonymous: bool = False, drop_logins: int = 0) -> None:  # noqa: C901 (a site)
        """*anonymous*: the redirect to the login form sets a new anonymous session cookie
        (as many sites do), in place of the expired one; *drop_logins*: the first logins
        after the spider's own get no answer (their connection closed)."""
        self.lock = threading.Lock()
        self.sessions: set[str] = set()
        self.logins = 0
        self.attempts = 0  # every login POST, its credentials right or wrong
        self.posts = 0
        self.expiries = 0
        self.answered = 0
        self.served: dict[int, int] = {}
        site = self

        class Handler(BaseHTTPRequestHandler):
            # connections kept alive, as a site's are (HTTP/1.0 closed each after its
            # answer, and a login POST sent on one the client thought open failed now and
            # then: ConnectionDone)
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.split("?")[0] == "/login":
                    form = '<form action="/login" method="post"><input name="user"></form>'
                    return self._send(200, form)
                if not site.session_of(self.headers.get("Cookie") or ""):
                    form = f"/login?next={self.path}"
                    if anonymous:
                        anon = f"session=anon{secrets.token_hex(8)}; Path=/"
                        return self._send(302, "", location=form, cookie=anon)
                    return self._send(302, "", location=form)
                if self.path.startswith("/page/"):
                    time.sleep(0.02)  # requests are in flight when the session ends
                    site.answer(int(self.path.rsplit("/", 1)[1]))
                    return self._send(200, f"<h1>{self.path.rsplit('/', 1)[1]}</h1>")
                return self._send(200, "welcome")

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with site.lock:
                    site.attempts += 1
                if parse_qs(body.decode()).get("user") != ["alice"]:
                    return self._send(403, "bad login")
                with site.lock:
                    site.posts += 1
                    drop = 1 < site.posts <= 1 + drop_logins
                if drop:  # no answer: the client sees its connection closed
                    self.close_connection = True
                    return None
                session = secrets.token_hex(8)
                with site.lock:
                    site.logins += 1
                    site.sessions.add(session)
                self._send(302, "", location="/welcome", cookie=f"session={session}; Path=/")

            def _send(self, status: int, body: str, **headers: str) -> None:
                data = f"<html><body>{body}</body></html>".encode()
                self.send_response(status)
                if "location" in headers:
                    self.send_header("Location", headers["location"])
                if "cookie" in headers:
                    self.send_header("Set-Cookie", headers["cookie"])
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def session_of(self, cookie: str) -> bool:
        values = dict(p.strip().split("=", 1) for p in cookie.split(";") if "=" in p)
        with self.lock:
            return values.get("session") in self.sessions

    def answer(self, page: int) -> None:
        with self.lock:
            self.served[page] = self.served.get(page, 0) + 1
            self.answered += 1
            if self.answered % EXPIRE_EVERY == 0 and self.answered < PAGES:
                self.sessions.clear()
                self.expiries += 1


SPIDER = """
import scrapy
from scrapy.http import FormRequest
from scrapy_ha.cookies import login_once

JAR = {"cookiejar": 1}


class Relogin(scrapy.Spider):
    name = "relogin"

    async def start(self):
        yield scrapy.Request(f"{self.base}/login", callback=self.form, meta=JAR)

    def form(self, response):
        yield FormRequest.from_response(
            response, formdata={"user": "alice"}, callback=self.first, meta=JAR
        )

    def first(self, response):
        for n in range(1, int(self.pages) + 1):
            yield scrapy.Request(f"{self.base}/page/{n}", meta=JAR)

    async def parse(self, response):
        if "/login?" in response.url:
            login = FormRequest.from_response(response, formdata={"user": "alice"})
            if self.login == "function":  # a login of its own steps
                async def steps(meta):
                    await self.crawler.engine.download_async(login.replace(meta=meta))
                yield await login_once(self, response, steps)
            else:
                yield await login_once(self, response, login)
            return
        yield {"page": int(response.css("h1::text").get())}
"""


def test_a_session_that_expires_under_two_workers_costs_one_login_per_expiry(
    redis_url: str, tmp_path: Path
) -> None:
    """Two workers of 8 requests each: at each of the 3 expiries about 16 requests meet the
    login form; one logs in (with a request on one worker, a function on the other), the
    others go again with its session once it answered. Every page is scraped, each by one
    item. (A spider that logs in wherever it meets the form: 74 to 98 logins here.)"""
    _crawl_two_workers(_Site(), redis_url, tmp_path, LOGINS)


def test_a_login_whose_answer_is_lost_is_sent_again(redis_url: str, tmp_path: Path) -> None:
    """The site closes the connection of the first two logins after the spider's own
    without an answer (as a kept-alive connection it had closed does to a POST): the login
    is sent again, not failed (a failed login raised in its page's callback: a full suite's
    run lost a page to LoginFailed after four such failures)."""
    site = _Site(drop_logins=2)
    logs = _crawl_two_workers(site, redis_url, tmp_path, ("request", "request"))
    assert site.posts == site.logins + 2
    assert "sending it again" in logs
    assert "'ha/retry/parse'" not in logs, "a page's callback raised with its login"


@pytest.mark.long  # (a crawl of 20 s like the one above: CI keeps that one)
def test_anonymous_session_cookies_set_on_the_way_to_the_login_form_replace_no_login(
    redis_url: str, tmp_path: Path
) -> None:
    """The site sets a new anonymous session cookie on each redirect to the login form: the
    answers to the requests sent with the expired session, which come while the login is in
    flight or after it, must not replace the new session in the jar (they did: each such
    answer cost every worker a login, 33 to 35 logins for 2 expiries and 94 to 96 of 240
    pages dead-lettered by LoginFailed)."""
    _crawl_two_workers(_Site(anonymous=True), redis_url, tmp_path, LOGINS)


def _crawl_two_workers(site: _Site, redis_url: str, tmp_path: Path, logins: tuple[str, str]) -> str:
    project = write_project(
        tmp_path / "project",
        "relogin",
        SPIDER,
        f'REDIS_URL = "{redis_url}"\nCONCURRENT_REQUESTS = 8\nHA_PREFETCH = 8\n',
    )
    try:
        workers = [
            crawl(
                project,
                "relogin",
                tmp_path / f"w{i}.log",
                args={"base": site.url, "pages": str(PAGES), "login": logins[i]},
                settings={"FEEDS": json.dumps({str(tmp_path / f"w{i}.jl"): {"format": "jsonl"}})},
            )
            for i in range(2)
        ]
        codes = [w.wait(300) for w in workers]
    finally:
        site.server.shutdown()
        site.server.server_close()
    logs = "\n".join((tmp_path / f"w{i}.log").read_text() for i in range(2))
    assert codes == [0, 0], logs[-4000:]
    items = [
        json.loads(line)["page"]
        for i in range(2)
        if (tmp_path / f"w{i}.jl").exists()
        for line in (tmp_path / f"w{i}.jl").read_text().splitlines()
    ]
    missing = sorted(set(range(1, PAGES + 1)) - set(items))
    twice = sorted(p for p in set(items) if items.count(p) > 1)
    assert (missing, twice) == ([], []), logs[-4000:]
    assert site.expiries == PAGES // EXPIRE_EVERY - 1
    # the first login (the spider's own) and one per expiry
    assert site.logins == site.expiries + 1, (site.logins, site.expiries, logs[-4000:])
    assert "'ha/cookies/login_waits'" in logs, "no request waited for another's login"
    return logs


START_PAGES = """
import scrapy
from scrapy.http import FormRequest
from scrapy_ha.cookies import login_once


class Starts(scrapy.Spider):
    name = "starts"

    async def start(self):
        for n in range(1, int(self.pages) + 1):
            yield scrapy.Request(f"{self.base}/page/{n}", meta={"cookiejar": 1})

    async def parse(self, response):
        if "/login?" in response.url:
            login = FormRequest.from_response(response, formdata={"user": self.user})
            yield await login_once(
                self, response, login, check=lambda answer: "/login" not in answer.url
            )
            return
        yield {"page": int(response.css("h1::text").get())}
"""


#: The spider of START_PAGES with credentials the site refuses.
WRONG = {"pages": "40", "user": "mallory"}


def test_start_pages_that_meet_the_login_form_go_again_and_are_crawled(
    redis_url: str, tmp_path: Path
) -> None:
    """The pages a crawl starts from need the session: each goes again after the login,
    which the check passes (its answer is the page it redirects to)."""
    site = _Site()
    project = write_project(
        tmp_path / "project",
        "starts",
        START_PAGES,
        f'REDIS_URL = "{redis_url}"\nCONCURRENT_REQUESTS = 4\nHA_PREFETCH = 4\n',
    )
    try:
        args = {"base": site.url, "pages": "3", "user": "alice"}
        worker = crawl(
            project,
            "starts",
            tmp_path / "w.log",
            args=args,
            settings={"FEEDS": json.dumps({str(tmp_path / "w.jl"): {"format": "jsonl"}})},
        )
        code = worker.wait(300)
    finally:
        site.server.shutdown()
        site.server.server_close()
    log = (tmp_path / "w.log").read_text()
    assert code == 0, log[-4000:]
    items = [json.loads(line)["page"] for line in (tmp_path / "w.jl").read_text().splitlines()]
    assert sorted(items) == [1, 2, 3], log[-4000:]
    assert site.logins == 1, log[-4000:]


def test_a_start_page_sent_again_twice_is_not_filtered(redis_url: str, tmp_path: Path) -> None:
    """Wrong credentials and no check: each start page goes again after each login, and
    after 5 raises LoginFailed (dead-lettered: the parse class gets no retry here). A page
    went again as the start request it had been (``is_start_request`` kept in its meta, its
    lease stripped), counted as the n-th start request of its URL in this run, a count
    reset once ``start()`` was read to its end: its second time was taken for the first,
    and filtered. 40 of 40 pages were neither crawled nor dead-lettered."""
    site = _Site()
    spider = START_PAGES.replace(', check=lambda answer: "/login" not in answer.url', "")
    project = write_project(
        tmp_path / "project",
        "starts",
        spider,
        f'REDIS_URL = "{redis_url}"\nCONCURRENT_REQUESTS = 4\nHA_PREFETCH = 4\n'
        'HA_RETRY_POLICIES = {"parse": {"times": 0}}\n',
    )
    try:
        args = WRONG | {"base": site.url, "pages": "10"}
        code = crawl(project, "starts", tmp_path / "w.log", args=args).wait(300)
    finally:
        site.server.shutdown()
        site.server.server_close()
    log = (tmp_path / "w.log").read_text()
    assert code == 0, log[-4000:]
    assert "'dupefilter/filtered'" not in log, log[-4000:]
    assert redis.Redis.from_url(redis_url).zcard(Keys("ha", "starts").dead) == 10, log[-4000:]
    assert log.count("(class parse): scrapy_ha.middlewares.logins.LoginFailed") == 10, log[-4000:]


def test_wrong_credentials_cost_one_login_for_the_crawl_with_a_check(
    redis_url: str, tmp_path: Path
) -> None:
    """A login whose answer fails the spider's check holds every other login back, on
    every worker, for ``after_failure`` (600 s): the pages that meet the form meanwhile
    raise LoginFailed at once. Without the check, wrong credentials cost up to 5 logins a
    page (a review: 28 logins for 40 pages), and sites lock such accounts."""
    site = _Site()
    project = write_project(
        tmp_path / "project",
        "starts",
        START_PAGES,
        f'REDIS_URL = "{redis_url}"\nCONCURRENT_REQUESTS = 4\nHA_PREFETCH = 4\n'
        'HA_RETRY_POLICIES = {"parse": {"times": 0}}\n',
    )
    try:
        workers = [
            crawl(project, "starts", tmp_path / f"w{i}.log", args=WRONG | {"base": site.url})
            for i in range(2)
        ]
        codes = [w.wait(300) for w in workers]
    finally:
        site.server.shutdown()
        site.server.server_close()
    logs = "\n".join((tmp_path / f"w{i}.log").read_text() for i in range(2))
    assert codes == [0, 0], logs[-4000:]
    assert (site.attempts, site.logins) == (1, 0), logs[-4000:]
    assert logs.count("failed its check") >= 40, logs[-4000:]
    assert "'ha/cookies/logins_failed': 1" in logs
    dead = redis.Redis.from_url(redis_url).zcard(Keys("ha", "starts").dead)
    assert dead == 40, logs[-4000:]


def test_a_login_refused_by_its_check_names_its_answer(redis_url: str, tmp_path: Path) -> None:
    """LoginFailed says what the check refused: a check written for a login that redirects
    refuses a site whose login answers 200 at /login on success, and the error blamed the
    credentials and the form alone (a review: 26 of 40 pages dead-lettered so, the login
    good)."""
    site = _Site()
    project = write_project(
        tmp_path / "project",
        "starts",
        START_PAGES,
        f'REDIS_URL = "{redis_url}"\nHA_RETRY_POLICIES = {{"parse": {{"times": 0}}}}\n',
    )
    try:
        args = WRONG | {"base": site.url, "pages": "2"}
        code = crawl(project, "starts", tmp_path / "w.log", args=args).wait(300)
    finally:
        site.server.shutdown()
        site.server.server_close()
    log = (tmp_path / "w.log").read_text()
    assert code == 0, log[-4000:]
    assert f"failed its check (its answer: HTTP 403 from {site.url}/login;" in log, log[-4000:]


@deferred_f_from_coro_f
async def test_a_login_that_failed_its_check_holds_every_login_back_for_its_pause(
    redis_url: str,
) -> None:
    """Login 1 failed: every claim, whatever session it was sent with, is told to fail
    (action 3) until the pause ends; then one claim logs in (login 2), the jar's session
    still that of the login before the failed one."""
    client = redis.asyncio.Redis.from_url(redis_url)
    jars = SharedJars(client, Keys("ha", "failed"))
    try:
        assert (await jars.login_step(1, "claim", 0, 60_000))[:2] == [2, 1]
        assert (await jars.login_step(1, "failed", 2, 300))[0] == 0, "not the login in flight"
        assert (await jars.login_step(1, "failed", 1, 300))[:2] == [1, 1]
        assert (await jars.login_step(1, "done", 1))[0] == 0, "a failed login is not done"
        for sent in (0, 1, 5):
            action, epoch, _version, left = await jars.login_step(1, "claim", sent, 60_000)
            assert (action, epoch) == (3, 1)
            assert 0 < left <= 300
        await jars.load(1)
        assert jars.epochs == {}, "the jar holds the session of the login before it (none)"
        # so the answers to requests sent with that session still change the jar
        url = "http://shop.test/page/7"
        answer = HtmlResponse(url, headers={"Set-Cookie": "seen=1; Path=/"}, request=Request(url))
        jar = CookieJar()
        jar.extract_cookies(answer, answer.request)
        assert await jars.store(1, snapshot(jar), [], 0) > 0
        await asyncio.sleep(0.35)
        assert (await jars.login_step(1, "claim", 0, 60_000))[:2] == [2, 2]
        assert (await jars.login_step(1, "done", 2))[:2] == [1, 2]
        assert await jars.login_step(1, "claim", 0, 60_000) == [1, 2, 2]
    finally:
        await client.aclose()


async def _login_step(redis_url: str, spider: str, step: str, epoch: int, ms: int) -> list[int]:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        return await SharedJars(client, Keys("ha", spider)).login_step(1, step, epoch, ms)
    finally:
        await client.aclose()


def test_a_requeue_lifts_the_hold_of_a_failed_login(redis_url: str) -> None:
    """The documented mend: new credentials, then ``scrapy-ha dlq requeue``. The hold of a
    failed login outlived both (a review: 80 pages dead-lettered by wrong credentials on a
    stopped crawl, requeued, the workers started again with the right ones within
    ``after_failure``: no login made, 300 of 300 pages dead-lettered by LoginFailed)."""
    assert _run(_login_step(redis_url, "held", "claim", 0, 60_000))[:2] == [2, 1]
    assert _run(_login_step(redis_url, "held", "failed", 1, 600_000))[0] == 1
    assert _run(_login_step(redis_url, "held", "claim", 0, 60_000))[0] == 3, "held"
    dead_letters(redis_url, "held", [("http://shop.test/page/1", "parse", None)])
    done = scrapy_ha("dlq", "requeue", "held", "--class", "parse", "-y", "--redis-url", redis_url)
    assert done.returncode == 0, done.stderr
    assert "requeued 1 of 1 entry" in done.stdout, done.stdout
    # the next page that meets the form logs in (login 2); the jar's session is still the
    # one before the failed login
    assert _run(_login_step(redis_url, "held", "claim", 0, 60_000))[:2] == [2, 2]
    assert "lifted the hold of 1 failed login(s)" in done.stderr, done.stderr


def _page(url: str, **meta: Any) -> HtmlResponse:
    return HtmlResponse(url, body=b"<html></html>", request=Request(url, meta=meta))


@deferred_f_from_coro_f
async def test_one_claim_logs_in_the_others_wait_then_go_again(redis_url: str) -> None:
    """The login state in Redis: the first claim logs in (epoch 1), a second waits while it
    is in flight, and goes again (with the jar's version) once its answer came; a request
    sent with that newer session that meets the expiry logs in again (epoch 2)."""
    client = redis.asyncio.Redis.from_url(redis_url)
    jars = SharedJars(client, Keys("ha", "claims"))
    try:
        assert await jars.login_step(1, "claim", 0, 60_000) == [2, 1, 0]
        assert (await jars.login_step(1, "claim", 0, 60_000))[0] == 0
        marked, epoch, version = await jars.login_step(1, "done", 1)
        assert (marked, epoch, version) == (1, 1, 1)
        assert await jars.login_step(1, "claim", 0, 60_000) == [1, 1, 1]
        assert await jars.login_step(1, "done", 1) == [0, 1, 1], "a login is done once"
        assert await jars.login_step(1, "claim", 1, 60_000) == [2, 2, 1]
        await jars.load(1)
        assert jars.epochs == {"1": 1}, "a login in flight: the jar holds the last done one's"
        # the hash gone (its TTL) while workers hold epoch 2: the next login is past it
        await client.delete(jars.keys.cookies)
        assert await jars.login_step(1, "claim", 2, 60_000) == [2, 3, 0]
    finally:
        await client.aclose()


@deferred_f_from_coro_f
async def test_a_login_whose_answer_never_comes_is_taken_over(redis_url: str) -> None:
    """Its worker was killed: after the timeout the next claim logs in (a new epoch), and
    the late answer of the first, if it ever comes, no longer counts."""
    client = redis.asyncio.Redis.from_url(redis_url)
    jars = SharedJars(client, Keys("ha", "takeover"))
    try:
        assert (await jars.login_step(None, "claim", 0, 200))[:2] == [2, 1]
        assert (await jars.login_step(None, "claim", 0, 200))[0] == 0
        await asyncio.sleep(0.3)
        assert (await jars.login_step(None, "claim", 0, 200))[:2] == [2, 2]
        assert (await jars.login_step(None, "done", 1))[0] == 0
        assert (await jars.login_step(None, "done", 2))[0] == 1
    finally:
        await client.aclose()


def test_the_page_sent_to_the_login_form_goes_again_as_it_was() -> None:
    """By default the request again is the first of the redirect chain, without the
    redirect's meta (and what belongs to one attempt), unfiltered."""
    redirected = _page(
        "http://shop.test/login",
        redirect_urls=["http://shop.test/page/7"],
        redirect_times=1,
        redirect_reasons=[302],
        cookiejar=1,
        **{metakeys.LOGIN_EPOCH: 3, metakeys.COOKIES_VERSION: 5},
    )
    again = _again(redirected.request, None)
    assert again.url == "http://shop.test/page/7"
    assert again.dont_filter
    assert again.meta == {"cookiejar": 1, metakeys.COOKIES_VERSION: 5}
    assert redirected.request.meta["redirect_urls"], "the response's request is left alone"


def test_login_epochs_read_from_the_field() -> None:
    assert login_epoch(None) == 0
    assert login_epoch(b"3 done 0") == 3
    assert login_epoch(b"4 run 1733000000000") == 3
    assert login_epoch(b"garbage") == 0


@deferred_f_from_coro_f
async def test_a_timeout_of_nothing_is_refused() -> None:
    class _Spider:
        crawler = None

    response = _page("http://shop.test/login", cookiejar=2)
    login = Request("http://shop.test/login", method="POST")
    with pytest.raises(ValueError, match="timeout must be above 0"):
        await login_once(_Spider(), response, login, timeout=0)  # type: ignore[arg-type]
    for after in (0, -1, float("nan"), float("inf"), 1e300, 30 * 86400 + 1):
        with pytest.raises(ValueError, match="after_failure must be seconds above 0"):
            await login_once(_Spider(), response, login, after_failure=after)  # type: ignore[arg-type]


@deferred_f_from_coro_f
async def test_a_page_that_meets_the_login_form_after_every_login_fails() -> None:
    """Wrong credentials would log in again and again: the page's count of logins met."""

    class _Spider:
        crawler = None

    url = "http://shop.test/login"
    page = _page(url, **{metakeys.LOGINS_MET: [url, MAX_LOGINS_MET]})
    with pytest.raises(LoginFailed, match="after 5 logins"):
        await login_once(_Spider(), page, Request(url))  # type: ignore[arg-type]
    # the count of another URL, in meta copied from the page that yielded this one, is not its
    copied = _page(url, **{metakeys.LOGINS_MET: ["http://shop.test/list", MAX_LOGINS_MET]})
    assert _logins_met(_again(copied.request, None)) == 0
    assert _logins_met(_again(page.request, None)) == MAX_LOGINS_MET


@deferred_f_from_coro_f
async def test_a_retry_made_anew_still_counts_the_logins_its_page_met() -> None:
    """A POST page goes again as a *retry* the spider builds (its redirect made it a GET):
    the count comes from the page, or wrong credentials logged in for ever (a QA crawl of 20
    POST pages, 2 workers: 465 logins in 55 s, no LoginFailed)."""

    class _Spider:
        crawler = None

    url = "http://shop.test/page/7"
    page = _page("http://shop.test/login?next=/page/7", **{metakeys.LOGINS_MET: [url, 5]})
    retry = Request(url, method="POST", body=b"q=7")
    with pytest.raises(LoginFailed, match="after 5 logins"):
        await login_once(_Spider(), page, Request("http://shop.test/login"), retry=retry)  # type: ignore[arg-type]


@deferred_f_from_coro_f
async def test_a_worker_whose_login_was_taken_over_takes_the_newer_session(
    redis_url: str,
) -> None:
    """This worker's login hung past its timeout and another worker's login is done: the
    pages of this worker that meet the form go again with the newer session, not with this
    worker's copy (kept while its own login was in flight). They went with the old one,
    met the form again at once, and after 5 such rounds were dead-lettered by LoginFailed
    (a review: a login hung 40 s with timeout=3, 3 workers: 19 and 18 of 240 pages lost)."""
    from scrapy_ha.middlewares.cookies import _SHARED, SharedCookiesMiddleware  # noqa: PLC0415

    client = redis.asyncio.Redis.from_url(redis_url)
    jars = SharedJars(client, Keys("ha", "taken"))
    owner = SharedCookiesMiddleware()
    owner._jars = jars

    class _Crawler:
        pass

    class _Spider:
        crawler = _Crawler()

    _SHARED[_Spider.crawler] = owner  # type: ignore[index]
    url = "http://shop.test/page/7"
    try:
        # this worker claimed login 1 (its copy holds the expired session), then hung
        assert (await jars.login_step(1, "claim", 0, 100))[:2] == [2, 1]
        jars.logging_in["1"] = 1
        old = HtmlResponse(url, headers={"Set-Cookie": "session=old; Path=/"}, request=Request(url))
        owner.jars[1] = CookieJar()
        owner.jars[1].extract_cookies(old, old.request)
        await asyncio.sleep(0.2)
        # another worker took it over (login 2), stored its new session, marked it done
        assert (await jars.login_step(1, "claim", 0, 60_000))[:2] == [2, 2]
        other = SharedJars(client, Keys("ha", "taken"))
        new = HtmlResponse(url, headers={"Set-Cookie": "session=new; Path=/"}, request=Request(url))
        theirs = CookieJar()
        theirs.extract_cookies(new, new.request)
        assert await other.store(1, snapshot(theirs), [], 2) > 0
        assert (await other.login_step(1, "done", 2))[0] == 1
        # a page of this worker, sent with the session of login 0, meets the form
        form = _page(
            "http://shop.test/login?next=/page/7",
            cookiejar=1,
            redirect_urls=[url],
            **{metakeys.LOGIN_EPOCH: 0},
        )
        again = await login_once(_Spider(), form, Request("http://shop.test/login"))  # type: ignore[arg-type]
        sending = owner.process_request(again)  # a coroutine when it loads the jar first
        if sending is not None:
            await sending
        assert again.headers.get("Cookie") == b"session=new"
    finally:
        await client.aclose()
