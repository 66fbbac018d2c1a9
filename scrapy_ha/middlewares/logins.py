"""One login per expiry of a shared cookie session: :func:`login_once`.

When a site's session expires, every request in flight meets the expiry (a redirect to the
login form), on every worker. A spider that logs in again on each such answer logs in once
per request in flight: dozens of logins for one expiry, which sites notice. With
:func:`login_once` the first of them logs in and the others wait for that login's answer;
then each page goes again with the new session (the shared jar carries it to every worker).

The login is downloaded at once, through the downloader middlewares (the cookies it sets
are shared, its redirects followed), not through the scheduler: the pages waiting for it
hold their leases, and a login queued behind them in Redis could wait for a free lease
that none of them gives back.

The state of each jar's login is one field of the crawl's cookies hash
(``lua/jar_login.lua``): the epoch of the last login, and whether its answer came. Each
request is sent with the epoch of the session its worker's copy of the jar holds
(``_ha_login_epoch``), so a request that met the expiry with the session of an older login
is sent again without a new login, and one that met it with the newest logs in again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response

from scrapy_ha import metakeys
from scrapy_ha.codec.masking import mask_url
from scrapy_ha.middlewares.cookie_changes import request_domains
from scrapy_ha.middlewares.cookies import shared_cookies
from scrapy_ha.store.connection import REDIS_DOWN_ERRORS
from scrapy_ha.store.jars import jar_field

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from scrapy import Request, Spider

__all__ = ["AFTER_FAILURE", "LOGIN_TIMEOUT", "MAX_LOGINS_MET", "LoginFailed", "login_once"]

logger = logging.getLogger(__name__)

#: How long a login may take (its request sent, its answer back) before another request that
#: meets the expiry logs in instead (seconds): the worker may have died with it.
LOGIN_TIMEOUT = 60.0
#: How long no login is made, on any worker, after one whose answer failed the spider's
#: check (seconds): wrong credentials log in once, not once per page, and sites lock an
#: account after a few failed logins.
AFTER_FAILURE = 600.0
#: The longest *after_failure* (30 days): the hold's end is written in ms as Lua prints a
#: number, exactly up to 10^14 (1e300 s was written as "1e+303", which no reader took:
#: the jar's login state was then read as none, no hold at all).
MAX_AFTER_FAILURE = 30 * 86400.0
#: How many times one page may be sent again after a login before :class:`LoginFailed`
#: (a login that never opens a session: wrong credentials, a changed form).
MAX_LOGINS_MET = 5
#: How many times a login request is sent when its download fails (it goes around the retry
#: middleware, ``dont_retry``: a login is not stored in Redis to be retried later, and a
#: POST whose kept-alive connection the site had closed fails at once).
LOGIN_ATTEMPTS = 3
#: The first and the longest pause between two looks at a login in flight (seconds).
FIRST_PAUSE, LONGEST_PAUSE = 0.1, 1.0
#: What Scrapy's redirect middleware adds to a redirected request's meta.
REDIRECT_KEYS = ("redirect_urls", "redirect_reasons", "redirect_times", "redirect_ttl")


class LoginFailed(Exception):
    """A page met the login form again after every one of its last logins answered, or
    while a login that failed the spider's check holds the others back."""


async def login_once(
    spider: Spider,
    response: Response,
    login: Request | Callable[[Any], Awaitable[Any]],
    *,
    retry: Request | None = None,
    timeout: float = LOGIN_TIMEOUT,
    check: Callable[[Any], bool] | None = None,
    after_failure: float = AFTER_FAILURE,
) -> Request:
    """The page that met the expiry of its session, to send again once a login answered:
    *response* is the answer that says so (the login form the page was redirected to).

    Of the requests that meet one expiry, on every worker, one logs in: it downloads
    *login* at once through the downloader middlewares (its redirects followed; its
    callback is not called), or awaits it when it is an async function (a login of several
    steps): it is given the meta each of its requests must carry (the jar and the mark of
    the login: while a login is in flight the jar takes only its requests' cookies), as in
    ``await self.crawler.engine.download_async(step.replace(meta={**step.meta, **meta}))``.
    The others wait for that login's answer. Then each gets its page again, to yield::

        async def parse(self, response):
            if "/login" in response.url:
                login = FormRequest.from_response(response, formdata=CREDENTIALS)
                yield await login_once(self, response, login)
                return
            ...

    The page again is *retry*, by default *response*'s request before its redirects, with
    ``dont_filter=True``. A login whose answer does not come within *timeout* seconds (its
    worker was killed) is taken over by the next request that meets the expiry. A page that
    meets the login form again after :data:`MAX_LOGINS_MET` logins raises
    :class:`LoginFailed` (wrong credentials log in again and again otherwise).

    *check*, given the login's answer (the response of *login*, its redirects followed, or
    what the login function returned), says whether the login opened a session, e.g.
    ``check=lambda answer: "/login" not in answer.url``. A login it refuses raises
    :class:`LoginFailed`, and so does every request that meets the form on any worker for
    *after_failure* seconds (the login is not tried again meanwhile): wrong credentials
    then cost one login per *after_failure*, not up to 5 per page. Without shared
    cookies (another scheduler, ``HA_SHARED_COOKIES = False``) or with Redis out of reach,
    this request logs in, as a spider without this helper would.
    """
    if timeout <= 0:
        raise ValueError(f"login_once: timeout must be above 0 seconds, got {timeout!r}")
    if not 0 < after_failure <= MAX_AFTER_FAILURE:
        raise ValueError(
            f"login_once: after_failure must be seconds above 0 and at most "
            f"{MAX_AFTER_FAILURE:.0f} (30 days), got {after_failure!r}"
        )
    page = response.request
    if page is None:
        raise ValueError(f"login_once: {response} has no request (a response made by hand?)")
    again = _again(page, retry)
    met = _logins_met(again, page)
    if met >= MAX_LOGINS_MET:
        raise LoginFailed(
            f"{again.url} met the login form again after {met} logins: the login does not "
            "open a session (its credentials, its form?)"
        )
    again.meta[metakeys.LOGINS_MET] = [again.url, met + 1]
    key = response.meta.get("cookiejar")
    owner, jars = shared_cookies(spider, page)
    if owner is None or jars is None:
        _checked(check, await _log_in(spider, login, key), key)
        return again
    sent = int(response.meta.get(metakeys.LOGIN_EPOCH, 0))
    pause, waited = FIRST_PAUSE, False
    while True:
        try:
            reply = await jars.login_step(key, "claim", sent, int(timeout * 1000))
        except REDIS_DOWN_ERRORS as exc:
            logger.warning(
                "Could not coordinate the login of cookie jar %s with the other workers "
                "(%s): this request logs in",
                jar_field(key),
                type(exc).__name__,
            )
            _checked(check, await _log_in(spider, login, key), key)
            return again
        action, epoch, version = reply[:3]
        if action == 3:
            raise LoginFailed(
                f"{again.url} met the login form while login {epoch} of cookie jar "
                f"{jar_field(key)}, which failed its check, holds the logins back "
                f"({reply[3] / 1000:.0f} s more)"
            )
        if action == 2:
            logger.info(
                "The session of cookie jar %s expired (met by %s): this worker logs in "
                "(login %d of the jar; the page was sent with the session of login %d)",
                jar_field(key),
                response.url,
                epoch,
                sent,
            )
            jars.count("ha/cookies/logins")
            await _claimed_login(spider, owner, (login, check, after_failure), page, key, epoch)
            version = jars.version(key)
        elif action == 1:
            jars.count("ha/cookies/login_waits" if waited else "ha/cookies/login_retries")
            await _taken_over(owner, jars, key, epoch)
        else:
            waited = True
            await asyncio.sleep(pause)
            pause = min(pause * 2, LONGEST_PAUSE)
            continue
        if version > again.meta.get(metakeys.COOKIES_VERSION, 0):
            again.meta[metakeys.COOKIES_VERSION] = version
        return again


async def _claimed_login(
    spider: Spider, owner: Any, how: tuple[Any, Any, float], page: Request, key: Any, epoch: int
) -> None:
    """Log in as login *epoch* of jar *key* (*how*: login_once's *login*, *check* and
    *after_failure*), then mark it done, or failed when its answer fails *check*
    (:class:`LoginFailed`: the pages waiting for it raise it too)."""
    login, check, after_failure = how
    jars = owner._jars
    jars.logging_in[jar_field(key)] = epoch  # its answers alone set the jar meanwhile
    failed = False
    try:
        answer = await _log_in(spider, login, key, epoch)
        failed = check is not None and not check(answer)
    finally:  # answered or raised: the waiting pages go again (and may log in)
        domains = request_domains(page)
        if not callable(login):
            domains |= request_domains(login)
        failed_ms = max(1, int(after_failure * 1000)) if failed else 0
        await owner.login_done(key, epoch, domains, failed_ms)  # (ends logging_in)
    if failed:
        jars.count("ha/cookies/logins_failed")
        raise LoginFailed(_failed_text(key, after_failure, answer))


def _checked(check: Callable[[Any], bool] | None, answer: Any, key: Any) -> None:
    """A login this worker made alone (no shared jar): :class:`LoginFailed` when its answer
    fails *check*."""
    if check is not None and not check(answer):
        raise LoginFailed(_failed_text(key, None, answer))


def _failed_text(key: Any, after_failure: float | None, answer: Any) -> str:
    """What a login the check refused answered (a check written for a login that redirects
    refuses a good one that answers 200 at its own URL), and how long it holds the others."""
    said = ""
    if isinstance(answer, Response):
        said = f"its answer: HTTP {answer.status} from {mask_url(answer.url)}; "
    held = f": no login for {after_failure:.0f} s, on any worker" if after_failure else ""
    return (
        f"the login of cookie jar {jar_field(key)} failed its check ({said}its credentials, "
        f"its form, or a check that refuses a good answer?){held}"
    )


async def _taken_over(owner: Any, jars: Any, key: Any, done: int) -> None:
    """A login of this worker still in flight, older than login *done* (another worker took
    it over after its timeout), no longer holds this worker's copy of the jar: it takes
    Redis's, the session of *done*. (Its pages went again with the expired session, met the
    form at once, and after 5 rounds were dead-lettered by :class:`LoginFailed`.)"""
    name = jar_field(key)
    if 0 < jars.logging_in.get(name, 0) < done:
        jars.logging_in.pop(name, None)
        await owner.take_jar(key)


def _logins_met(again: Request, page: Request | None = None) -> int:
    """How many times *again* was sent again after a login, from its meta or from *page*'s
    (the request that met the form: a *retry* the spider made anew carries none), counted
    for its URL, so that a page whose callback copies its meta into the requests it yields
    (``meta=response.meta``) does not hand its count on to them."""
    counts = [0]
    for request in (again, page):
        met = request.meta.get(metakeys.LOGINS_MET) if request is not None else None
        if isinstance(met, list) and len(met) == 2 and met[0] == again.url:
            counts.append(int(met[1]))
    return max(counts)


async def _log_in(
    spider: Spider, login: Request | Callable[[Any], Awaitable[Any]], key: Any, epoch: int = 0
) -> Any:
    """Download *login* now (not through the scheduler), or run it when it is a function,
    given the meta each of its requests must carry: the jar, and the epoch of the login it
    is (while it is in flight the jar takes only its answers' cookies). Returns its answer
    (the response, or what the function returned)."""
    meta: dict[str, Any] = {"dont_retry": True}
    if key is not None:
        meta["cookiejar"] = key
    if epoch:
        meta[metakeys.LOGIN_EPOCH] = epoch
        meta[metakeys.LOGGING_IN] = True
    if callable(login):
        return await login(dict(meta))
    request = login.replace(meta={**login.meta, **meta})
    for attempt in range(1, LOGIN_ATTEMPTS + 1):
        try:
            answer = await spider.crawler.engine.download_async(request)
        except IgnoreRequest:
            raise
        except Exception as exc:  # its answer lost (a kept-alive connection the site closed)
            if attempt == LOGIN_ATTEMPTS:
                raise
            logger.warning("The login %s failed (%r): sending it again", login, exc)
            continue
        logger.info("Logged in with %s: HTTP %d from %s", login, answer.status, answer.url)
        return answer
    return None  # (not reached: the last attempt returns or raises)


def _again(page: Request, retry: Request | None) -> Request:
    """The request that met the expiry (*page*, the last of its redirects, or the user's
    *retry*), to send again (unfiltered, a new attempt)."""
    if retry is None:
        retry = page
        urls = retry.meta.get("redirect_urls")
        if urls:
            retry = retry.replace(url=urls[0])
            for name in REDIRECT_KEYS:
                retry.meta.pop(name, None)
    retry = retry.replace(dont_filter=True)
    for name in metakeys.STRIPPED:
        retry.meta.pop(name, None)
    # not a start request again: one (without its lease) is filtered as the n-th start
    # request of its URL in this run, and a second time again was taken for the first
    retry.meta.pop("is_start_request", None)
    return retry
