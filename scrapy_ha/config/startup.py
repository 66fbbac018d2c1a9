"""A crawl that cannot start: one ERROR line that says why, and the spider closed as soon as
it opens with the finish reason ``ha_start_failed`` (``scrapy crawl`` exits with 1).

Why: a bad setting of any scrapy-ha component, or what the scheduler finds when it opens (an
unreachable Redis, settings the crawl in Redis refused). A middleware checks its settings
when Scrapy builds it, before the scheduler exists (the engine builds its middlewares first):
:func:`configured` says the error and switches the middleware off (``NotConfigured``) instead
of raising it, which Scrapy printed as a traceback ("Task exception was never retrieved")
with no finish reason. The close does not depend on the scheduler: it holds with Scrapy's
own too. A setting two components read (``HA_ITEMS``: the scheduler and the checkpoint
middleware) is said once.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, TypeVar

import scrapy
from scrapy import signals
from scrapy.exceptions import CloseSpider, NotConfigured
from scrapy.utils.asyncio import call_later, is_asyncio_available
from scrapy.utils.defer import deferred_from_coro

from scrapy_ha.codec.log_masking import install_log_masking
from scrapy_ha.config.known import warn_unknown
from scrapy_ha.config.validate import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.core.scheduler import BaseScheduler
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

__all__ = [
    "CLOSE_SPIDER_FROM_SPIDER_OPENED",
    "START_FAILED",
    "FailedExit",
    "asyncio_missing",
    "StartRefusal",
    "checked_start",
    "configured",
    "own_scheduler",
    "reactor_refusal",
    "refuse_start",
    "scrapy_command",
    "start_refused",
    "warn_unknown",
]

logger = logging.getLogger("scrapy_ha")

#: Finish reason of a crawl that could not start (unreachable Redis, a bad setting, settings
#: the crawl in Redis refused).
START_FAILED = "ha_start_failed"
#: The reactor scrapy-ha needs: Redis is spoken to with redis.asyncio, on the asyncio loop.
ASYNCIO_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
#: Scrapy 2.19 closes the spider when a ``spider_opened`` handler raises ``CloseSpider``
#: (checked on 2.19.0); 2.16 logs the exception and goes on.
CLOSE_SPIDER_FROM_SPIDER_OPENED = tuple(map(int, scrapy.__version__.split(".")[:2])) >= (2, 19)

T = TypeVar("T")


class FailedExit:
    """Make ``scrapy crawl`` exit non-zero once the spider closed: Scrapy marks a crawl whose
    crawler has no spider as failed. ``crawler.spider`` is forgotten after ``spider_closed``,
    on 2.16 only after ``engine_stopped``: start requests may still be scheduled after
    ``spider_closed`` there, and components assert ``crawler.spider``; but a spider closed
    before the engine started (a refusal at ``spider_opened``, Scrapy's own scheduler) sees
    no ``engine_stopped``: forgotten at ``spider_closed`` then. Keep the object: signal
    handlers are held weakly. It holds its crawler weakly: kept for a crawler
    (:func:`refuse_start`), it must not keep that crawler alive."""

    def __init__(self, crawler: Crawler) -> None:
        self._crawler = weakref.ref(crawler)
        crawler.signals.connect(self._closed, signal=signals.spider_closed)
        if not CLOSE_SPIDER_FROM_SPIDER_OPENED:
            crawler.signals.connect(self._forget_spider, signal=signals.engine_stopped)

    @property
    def crawler(self) -> Crawler:
        crawler = self._crawler()
        assert crawler is not None  # signalled by it: alive
        return crawler

    def _closed(self) -> None:
        if CLOSE_SPIDER_FROM_SPIDER_OPENED or not getattr(self.crawler.engine, "running", False):
            self._forget_spider()

    def _forget_spider(self) -> None:
        self.crawler.spider = None


class StartRefusal(FailedExit):
    """Close the spider as soon as it opens, with *reason*, and make ``scrapy crawl`` exit
    non-zero (:class:`FailedExit`).

    ``CloseSpider`` is raised from ``spider_opened``, not from the scheduler's ``open()``:
    raised there it would skip opening the scraper, whose close then fails with a
    traceback. Scrapy 2.19 honours it; 2.16 ignores it, so the spider is closed right after
    the handlers (``engine.close_spider_async``), scheduled on the reactor or the asyncio
    loop, whichever runs: under another reactor than asyncio's (refused for it) there is no
    asyncio loop, and the spider stayed open for good.
    """

    def __init__(self, crawler: Crawler, reason: str) -> None:
        super().__init__(crawler)
        self.reason = reason
        crawler.signals.connect(self._refuse, signal=signals.spider_opened)

    def _refuse(self) -> None:
        if CLOSE_SPIDER_FROM_SPIDER_OPENED:
            raise CloseSpider(self.reason)
        engine = self.crawler.engine
        assert engine is not None
        call_later(0, lambda: deferred_from_coro(engine.close_spider_async(reason=self.reason)))


#: each crawl refused -> (its refusal, what was said of it)
_REFUSED: weakref.WeakKeyDictionary[Crawler, tuple[StartRefusal, set[str]]] = (
    weakref.WeakKeyDictionary()
)


def refuse_start(crawler: Crawler, why: str | None = None) -> None:
    """*crawler* cannot start: say *why* at ERROR (once per crawl and reason; None: said
    already, where it was found), and close the spider as soon as it opens."""
    if crawler not in _REFUSED:
        _REFUSED[crawler] = (StartRefusal(crawler, START_FAILED), set())
    said = _REFUSED[crawler][1]
    if why is not None and why not in said:
        said.add(why)
        logger.error("scrapy-ha cannot start: %s", why)


def start_refused(crawler: Crawler) -> bool:
    """Whether a component of *crawler* refused its start (:func:`refuse_start`)."""
    return crawler in _REFUSED


def configured(crawler: Crawler, read: Callable[[BaseSettings], T]) -> T:
    """A component's configuration, *read* from *crawler*'s settings; a bad setting refuses
    the crawl's start (said once) and raises ``NotConfigured`` (Scrapy leaves the component
    out, without a word)."""
    try:
        return read(crawler.settings)
    except ConfigError as exc:
        refuse_start(crawler, str(exc))
        raise NotConfigured from None


def asyncio_missing() -> bool:
    """Whether another Twisted reactor than asyncio's is installed: no asyncio code runs."""
    try:
        return not is_asyncio_available()
    except RuntimeError:  # no reactor installed yet (a scheduler built outside a crawl)
        return False


def reactor_refusal(settings: BaseSettings) -> str | None:
    """Why scrapy-ha cannot run under the installed Twisted reactor, or None: it talks to
    Redis with ``redis.asyncio``, which needs the asyncio reactor (another one crashed the
    worker with ``RuntimeError: no running event loop`` tracebacks)."""
    if not asyncio_missing():
        return None
    from twisted.internet import reactor  # noqa: PLC0415 (installed: read, not installed)

    installed = f"{type(reactor).__module__}.{type(reactor).__qualname__}"
    return (
        f"TWISTED_REACTOR={settings.get('TWISTED_REACTOR')!r} (the reactor installed is "
        f"{installed}): scrapy-ha talks to Redis with redis.asyncio and needs the asyncio "
        f"reactor, Scrapy's default. Remove the setting, or set TWISTED_REACTOR = "
        f"{ASYNCIO_REACTOR!r}"
    )


def checked_start(crawler: Crawler, shell: bool = False) -> BaseScheduler | None:
    """What the scheduler checks before its own settings: log lines masked from here on,
    ``HA_*`` settings that do nothing (WARNINGs, :func:`warn_unknown`) and the reactor
    (:func:`reactor_refusal`: the start is refused, and the scheduler never connects).
    Returns Scrapy's own scheduler, to use instead, for a Scrapy command that crawls a
    request of its own (:func:`scrapy_command`; *shell*: ``scrapy shell``'s engine)."""
    install_log_masking()
    if (command := "shell" if shell else scrapy_command(crawler)) is not None:
        return own_scheduler(crawler, command)
    warn_unknown(crawler.settings)
    why = reactor_refusal(crawler.settings)
    if why is not None:
        refuse_start(crawler, why)
    return None


#: Where Scrapy's commands live: ``scrapy fetch``, ``view`` and ``parse`` give the spider a
#: ``start()`` of theirs, defined there, that yields the one request they were asked for.
COMMANDS_PACKAGE = "scrapy.commands."


def scrapy_command(crawler: Crawler) -> str | None:
    """The Scrapy command whose own request *crawler* crawls (``fetch``, ``view``,
    ``parse``), or None for a crawl (``scrapy crawl``, ``runspider``, a script). The
    shell, which keeps the spider's ``start()``, is told by its engine instead."""
    module = getattr(getattr(crawler.spidercls, "start", None), "__module__", None) or ""
    return module.removeprefix(COMMANDS_PACKAGE) if module.startswith(COMMANDS_PACKAGE) else None


def own_scheduler(crawler: Crawler, command: str) -> BaseScheduler:
    """Scrapy's scheduler, for ``scrapy <command>``: its request, whose callback is the
    command's and whose meta Redis cannot hold, is not the crawl's. Through Redis it was
    refused (nothing printed, exit code 0), and the command joined the spider's crawl as a
    worker: it crawled the crawl's requests, their items lost to the crawl's feeds."""
    from scrapy.core.scheduler import Scheduler  # noqa: PLC0415 (only for these commands)

    logger.info(
        "a Scrapy command (scrapy.commands.%s) crawls a request of its own, not the crawl's: "
        "Scrapy's own scheduler runs it in this process, and the crawl in Redis is left alone",
        command,
    )
    return Scheduler.from_crawler(crawler)
