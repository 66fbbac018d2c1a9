"""The dashboard's web application: server-rendered pages and the ``/api/`` JSON behind them.

Every page is readable with JavaScript off; every action is a POST that is confirmed on a
page of its own (which says how many entries it would touch) before it runs, and reported
with how many it touched. docs/dashboard.md documents the routes.
"""

from __future__ import annotations

import json
import logging
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import redis.exceptions
from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException as StarletteHTTPException

from scrapy_ha.codec.masking import mask_text
from scrapy_ha.dashboard import _guard
from scrapy_ha.dashboard._acting import action_named, api_action, form_action, text_of
from scrapy_ha.dashboard._actions import ACTIONS
from scrapy_ha.dashboard._chart import class_chart, rate_chart
from scrapy_ha.dashboard._pages import render, setup_templates
from scrapy_ha.dashboard._tables import page_json
from scrapy_ha.dashboard._throttle import LoginThrottle
from scrapy_ha.dashboard._views import (
    crawl_view,
    entry_view,
    overview_rows,
    table_page,
    window_of,
)
from scrapy_ha.ops.crawls import KeyNames
from scrapy_ha.ops.labels import CLASSES
from scrapy_ha.ops.unreadable import CrawlUnreadable, explain
from scrapy_ha.ops.waiting import HELD_KINDS
from scrapy_ha.store.connection import REDIS_DOWN_ERRORS
from scrapy_ha.verdict import RETRY_CLASSES

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable


logger = logging.getLogger(__name__)

HERE = Path(__file__).parent
#: The classes a table's filter offers: what dead letters and delayed entries may have.
TABLE_CLASSES = {
    "dead": [c for c in CLASSES if c not in HELD_KINDS],
    "delayed": [c for c in CLASSES if c in (*RETRY_CLASSES, *HELD_KINDS)],
}


def create_app(
    client: Any,
    prefix: str,
    *,
    token: str | None = None,
    close_client: bool = False,
    where: str | None = None,
) -> FastAPI:
    """The dashboard of every crawl under *prefix* in the Redis of *client*
    (``redis.asyncio``); with *token*, every request must carry it. With *close_client*,
    the client is closed when the application shuts down (on the loop that used it).
    *where* is the Redis's URL, password masked, for the answer when it does not answer."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        if close_client:
            await client.aclose()

    app = FastAPI(
        title="scrapy-ha dashboard",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # (its schema described the API to anyone who could reach it)
        lifespan=lifespan,
    )
    app.state.client = client
    app.state.prefix = prefix
    app.state.token = token
    app.state.where = where
    app.state.csrf_secret = _guard.new_secret()
    app.state.templates = setup_templates(Jinja2Templates(directory=str(HERE / "templates")))
    app.state.login_throttle = LoginThrottle()
    app.state.key_names = KeyNames(prefix)  # a key name that is not UTF-8: logged once
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")
    app.middleware("http")(_guard_request)
    app.exception_handler(CrawlUnreadable)(_unreadable)
    app.exception_handler(redis.exceptions.ResponseError)(_wrong_type)
    for error in REDIS_DOWN_ERRORS:
        if error not in (ConnectionError, OSError):  # (Python's own: not Redis's alone)
            app.exception_handler(error)(_redis_down)
    app.exception_handler(StarletteHTTPException)(_http_error)
    _routes(app)
    return app


async def _guard_request(
    request: Request, call_next: Callable[[Request], Awaitable[Response]]
) -> Response:
    token: str | None = request.app.state.token
    path = request.url.path
    if token is None and _guard.host_name(request.headers.get("host", "")) not in (
        _guard.LOOPBACK_HOSTS
    ):
        return JSONResponse({"error": "this dashboard answers loopback host names only"}, 421)
    public = path == "/login" or path.startswith("/static/")  # (the login page's style)
    if token is not None and not public and not _authorised(request, token):
        if path.startswith("/api/"):
            return JSONResponse({"error": "missing or wrong token"}, 401)
        return RedirectResponse("/login?" + urlencode({"next": path}), 303)
    if request.method == "POST":
        refused = _refuse_post(request)
        if refused is not None:
            return refused
    session = request.cookies.get(_guard.CSRF_COOKIE) or _guard.new_csrf()
    request.state.csrf = _guard.form_token(request.app.state.csrf_secret, session)
    response = await call_next(request)
    response.headers.update(_SAFE_HEADERS)
    if _guard.CSRF_COOKIE not in request.cookies:
        response.set_cookie(_guard.CSRF_COOKIE, session, httponly=True, samesite="strict")
    return response


def _refuse_post(request: Request) -> Response | None:
    """A POST from another origin (see :func:`_guard.foreign_post`), or to ``/api/`` in
    another type than JSON: the answer that refuses it."""
    foreign = _guard.foreign_post(request.headers, request.url.scheme)
    if foreign is not None:
        logger.warning(
            "dashboard: refused a POST to %s from another origin (%s)", request.url.path, foreign
        )
        error = f"a POST from another origin is refused ({foreign}): use the dashboard's pages"
        return JSONResponse({"error": error}, 403)
    if request.url.path.startswith("/api/"):
        if request.headers.get("content-type", "").split(";")[0] != "application/json":
            return JSONResponse({"error": "POST /api/... takes application/json"}, 415)
    return None


#: Headers of every answer: no page in another site's frame, no type guessed from a body
#: (a 400 echoes the query's text as text/plain).
_SAFE_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "frame-ancestors 'none'",
}


async def _redis_down(request: Request, exc: Exception) -> Response:
    """Redis unreachable or too slow: a 503 that says so (it was a bare 500), the page
    back once Redis answers (the live refresh goes on asking); or Redis refusing the
    dashboard's user, which no reload mends."""
    why = f"{type(exc).__name__}: {mask_text(str(exc))}"
    where = request.app.state.where
    redis_at = f"Redis at {where}" if where else "Redis"  # (which one, behind Sentinel)
    if isinstance(exc, (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError)):
        # it answered, and refused: no reload mends it
        error, then = (
            f"{redis_at} refused the dashboard's user ({why})",
            "start it with a user and password Redis takes (--redis-url)",
        )
    elif acting := getattr(request.state, "acting", None):  # sent, perhaps run: not known
        error = (
            f"{redis_at} did not answer ({why}): the {acting} may have been done, in part or whole"
        )
        then = "look at the crawl's tables before acting again"
    else:
        error, then = f"{redis_at} did not answer ({why})", "reload once it is back"
    logger.warning("dashboard: %s on %s", error, request.url.path)
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": error}, 503)
    return PlainTextResponse(f"error: {error}; {then}\n", 503)


async def _unreadable(request: Request, exc: Exception) -> Response:
    """A crawl that cannot be read (a key of another type): a 409 that names the key (the
    state in Redis is at fault, not the dashboard)."""
    error = f"cannot read the crawl: {exc}"
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": error}, UNREADABLE_STATUS)
    return PlainTextResponse(f"error: {error}\n", UNREADABLE_STATUS)


async def _http_error(request: Request, exc: Exception) -> Response:
    """A 404 or 400 of a page: a line of text (FastAPI's JSON stays for ``/api/``)."""
    if request.url.path.startswith("/api/") or not isinstance(exc, StarletteHTTPException):
        return await http_exception_handler(request, exc)  # type: ignore[arg-type]
    return PlainTextResponse(f"error: {exc.detail}\n", exc.status_code, headers=exc.headers)


#: The answer of a page or an action on a crawl that cannot be read: 409 Conflict, the
#: state in Redis conflicts with what scrapy-ha writes (the reason names the key).
UNREADABLE_STATUS = 409


async def _wrong_type(request: Request, exc: Exception) -> Response:
    """Redis's WRONGTYPE out of any page or action of a crawl (a table, an entry, an
    action): explained as :func:`_unreadable` does, naming the key."""
    spider = request.path_params.get("spider")
    if "WRONGTYPE" not in str(exc) or not spider:
        raise exc
    client, prefix = request.app.state.client, request.app.state.prefix
    return await _unreadable(request, await explain(client, prefix, spider, exc))


def _authorised(request: Request, token: str) -> bool:
    bearer = request.headers.get("authorization", "")
    given = bearer[7:] if bearer.lower().startswith("bearer ") else None
    return (
        _guard.same(given, token)
        or _guard.same(request.headers.get(_guard.TOKEN_HEADER), token)
        or _guard.same(request.cookies.get(_guard.SESSION_COOKIE), _guard.session_value(token))
    )


def _throttled(request: Request, target: str, wait: float) -> HTMLResponse:
    """The login form again, refused: too many wrong tokens from this address lately."""
    error = f"too many wrong tokens from this address: try again in {wait:.0f} s"
    page = render(request, "login.html", next=target, error=error)
    page.status_code = 429
    page.headers["Retry-After"] = str(max(1, round(wait)))
    return page


# -- routes ---------------------------------------------------------------------------------


def _read(app: FastAPI, path: str, **kwargs: Any) -> Callable[..., Any]:
    """A page or API route that answers GET and HEAD (an uptime check's HEAD was a 405)."""
    return app.api_route(path, methods=["GET", "HEAD"], **kwargs)


def _routes(app: FastAPI) -> None:
    _html_routes(app)
    _api_routes(app)
    _login_routes(app)


def _html_routes(app: FastAPI) -> None:
    @_read(app, "/", response_class=HTMLResponse)
    async def overview(request: Request) -> HTMLResponse:
        crawls, unreadable = await overview_rows(request)
        charts = {c.data["spider"]: rate_chart(c.stats, window_of(request)) for c in crawls}
        rows = [c.data for c in crawls]
        return render(
            request, "overview.html", crawls=rows, unreadable=unreadable, charts=charts, live=True
        )

    @_read(app, "/crawls/{spider}", response_class=HTMLResponse)
    async def crawl(request: Request, spider: str) -> HTMLResponse:
        found, window = await crawl_view(request, spider), window_of(request)
        charts = [
            rate_chart(found.stats, window),
            class_chart(found.stats, "retried", window),
            class_chart(found.stats, "dead", window),
        ]
        return render(
            request,
            "crawl.html",
            spider=spider,
            crawl=found.data,
            charts=charts,
            window=window,
            pause_actions=True,
            live=True,
        )

    @_read(app, "/crawls/{spider}/{table}", response_class=HTMLResponse)
    async def table(request: Request, spider: str, table: str) -> HTMLResponse:
        flt, page = await table_page(request, spider, table)
        return render(
            request,
            "table.html",
            spider=spider,
            table=table,
            flt=flt,
            page=page,
            query=dict(request.query_params),
            actions=[a for a in ACTIONS.values() if a.table == table],
            classes=TABLE_CLASSES[table],
        )

    @_read(app, "/crawls/{spider}/actions/{name}")
    async def acted(request: Request, spider: str, name: str) -> RedirectResponse:
        """The address of an action's report entered again (a GET): back to its table
        or the crawl's page, nothing done."""
        table = action_named(name).table
        where = f"/crawls/{quote(spider, safe='')}"
        return RedirectResponse(where + (f"/{table}" if table in TABLE_CLASSES else ""), 303)

    @_read(app, "/crawls/{spider}/{table}/{entry_id}", response_class=HTMLResponse)
    async def entry(request: Request, spider: str, table: str, entry_id: str) -> HTMLResponse:
        data = await entry_view(request, spider, table, entry_id)
        shown = json.dumps(data["request"], indent=2, ensure_ascii=False)
        return render(
            request,
            "entry.html",
            spider=spider,
            table=table,
            entry=data,
            request_json=shown,
            actions=[a for a in ACTIONS.values() if a.table == table],
        )

    @app.post("/crawls/{spider}/actions/{name}", response_class=HTMLResponse)
    async def act(request: Request, spider: str, name: str) -> HTMLResponse:
        return await form_action(request, spider, name)


def _api_routes(app: FastAPI) -> None:
    @_read(app, "/api/crawls")
    async def api_crawls(request: Request) -> dict[str, Any]:
        crawls, unreadable = await overview_rows(request)
        rows = [c.data for c in crawls]
        return {"prefix": request.app.state.prefix, "crawls": rows, "unreadable": unreadable}

    @_read(app, "/api/crawls/{spider}")
    async def api_crawl(request: Request, spider: str) -> dict[str, Any]:
        return (await crawl_view(request, spider)).data

    @_read(app, "/api/crawls/{spider}/{table}")
    async def api_table(request: Request, spider: str, table: str) -> dict[str, Any]:
        flt, page = await table_page(request, spider, table)
        return page_json(spider, table, flt, page)

    @_read(app, "/api/crawls/{spider}/{table}/{entry_id}")
    async def api_entry(request: Request, spider: str, table: str, entry_id: str) -> Any:
        return await entry_view(request, spider, table, entry_id)

    @app.post("/api/crawls/{spider}/actions/{name}")
    async def api_act(request: Request, spider: str, name: str) -> dict[str, Any]:
        return await api_action(request, spider, name)


def _login_routes(app: FastAPI) -> None:
    @_read(app, "/login", response_class=HTMLResponse)
    async def login_form(request: Request) -> HTMLResponse:
        return render(request, "login.html", next=request.query_params.get("next", "/"))

    @app.post("/login")
    async def login(request: Request) -> Response:
        form = await request.form()
        token: str | None = request.app.state.token
        target = text_of(form.get("next")) or "/"
        if not target.startswith("/") or target.startswith("//"):
            target = "/"
        throttle: LoginThrottle = request.app.state.login_throttle
        who = request.client.host if request.client else "?"
        if wait := throttle.wait(who):  # the token is not even compared
            return _throttled(request, target, wait)
        if token is None or not _guard.same(text_of(form.get("token")), token):
            throttle.failed(who)
            return render(request, "login.html", next=target, error="wrong token")
        throttle.passed(who)
        response = RedirectResponse(target, 303)
        response.set_cookie(
            _guard.SESSION_COOKIE, _guard.session_value(token), httponly=True, samesite="strict"
        )
        return response


__all__ = ["create_app"]
