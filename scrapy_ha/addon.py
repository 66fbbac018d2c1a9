"""``scrapy_ha.Addon``: wires everything scrapy-ha offers into a project.

``ADDONS = {"scrapy_ha.Addon": 0}``:

- sets ``SCHEDULER = "scrapy_ha.Scheduler"``;
- replaces Scrapy's ``RetryMiddleware`` (550) with ``scrapy_ha.retry.RetryMiddleware`` and
  adds ``scrapy_ha.retry.ParseErrorMiddleware`` next to the spider;
- adds ``scrapy_ha.revisit.RevisitMiddleware`` (580): conditional requests and change
  detection for revisited requests (``HA_REVISIT``, ``meta["ha_revisit"]``);
- adds ``scrapy_ha.proxy.ProxyMiddleware`` (740, before Scrapy's HttpProxyMiddleware) and
  ``scrapy_ha.useragent.UserAgentPoolMiddleware`` (400), which stay off until
  ``HA_PROXY_MODE`` / ``HA_USER_AGENTS`` are set;
- adds ``scrapy_ha.parent.ParentLeaseMiddleware`` (spider, 10): each yielded request
  carries the lease of its page (children fenced by it; an unstorable child fails it);
- adds ``scrapy_ha.checkpoint.CheckpointMiddleware`` (spider, 900), off until
  ``HA_CHECKPOINTS = True``;
- replaces Scrapy's ``CookiesMiddleware`` (700) with ``scrapy_ha.cookies.SharedCookiesMiddleware``
  and adds ``scrapy_ha.cookies.CookieVersionMiddleware`` (spider, 11): cookie jars shared by
  every worker (``HA_SHARED_COOKIES``), unless the project set Scrapy's cookie middleware itself;
- stores feed exports to local files (``-o items.jl``, ``FEEDS``) with each item flushed to
  the file at once (:mod:`scrapy_ha.sinks.feeds`: a SIGKILL lost what Python's buffer held,
  of pages already acked), unless the project set ``FEED_STORAGES`` for them itself;
- switches off Scrapy's remote-control server on workers;
- masks every log line of the worker from the start, Scrapy's "Overridden settings" line
  included (a password in ``REDIS_URL``, ``HTTPAUTH_PASS``, a webhook URL...): see
  :func:`scrapy_ha.codec.log_masking.install_log_masking`.

A setting or middleware order the project set itself is left alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy_ha.codec.log_masking import install_log_masking

if TYPE_CHECKING:
    from collections.abc import Mapping

    from scrapy.settings import BaseSettings

__all__ = ["Addon"]

#: What the add-on sets, at "addon" priority (below the project's own settings).
ADDON_SETTINGS = {
    "SCHEDULER": "scrapy_ha.Scheduler",
    "REMOTE_CONTROL_ENABLED": False,
}
#: Downloader middlewares: ours at the place of Scrapy's RetryMiddleware, which is disabled.
DOWNLOADER_MIDDLEWARES = {
    "scrapy.downloadermiddlewares.retry.RetryMiddleware": None,
    "scrapy_ha.retry.RetryMiddleware": 550,
    "scrapy_ha.useragent.UserAgentPoolMiddleware": 400,  # only with HA_USER_AGENTS
    "scrapy_ha.proxy.ProxyMiddleware": 740,  # only with HA_PROXY_MODE
    # revisits (HA_REVISIT, meta ha_revisit): after HttpCompressionMiddleware (590) on the
    # way back, so that it sees decompressed bodies; before the retry middleware
    "scrapy_ha.revisit.RevisitMiddleware": 580,
}
#: Spider middlewares: close to the spider, so that it sees callback exceptions first.
SPIDER_MIDDLEWARES = {
    # outermost: sees every yielded request
    "scrapy_ha.parent.ParentLeaseMiddleware": 10,
    "scrapy_ha.retry.ParseErrorMiddleware": 950,
    "scrapy_ha.checkpoint.CheckpointMiddleware": 900,  # only with HA_CHECKPOINTS = True
    "scrapy_ha.cookies.CookieVersionMiddleware": 11,  # stamps the jar version on requests
}
#: Scrapy's cookie middleware and ours, which takes its place (same order: 700).
SCRAPY_COOKIES = "scrapy.downloadermiddlewares.cookies.CookiesMiddleware"
SHARED_COOKIES = {SCRAPY_COOKIES: None, "scrapy_ha.cookies.SharedCookiesMiddleware": 700}


class Addon:
    """Enable with ``ADDONS = {"scrapy_ha.Addon": 0}``."""

    def update_settings(self, settings: BaseSettings) -> None:
        install_log_masking()  # before Scrapy logs the settings, passwords included
        for name, value in ADDON_SETTINGS.items():
            settings.set(name, value, priority="addon")
        _add_components(settings, "DOWNLOADER_MIDDLEWARES", DOWNLOADER_MIDDLEWARES)
        _add_components(settings, "SPIDER_MIDDLEWARES", SPIDER_MIDDLEWARES)
        if SCRAPY_COOKIES not in settings["DOWNLOADER_MIDDLEWARES"]:  # else the project chose
            _add_components(settings, "DOWNLOADER_MIDDLEWARES", SHARED_COOKIES)
        _add_components(settings, "FEED_STORAGES", FEED_STORAGES)


#: Feed storages of local files whose writes reach the file at once (scrapy_ha.sinks.feeds).
FEED_STORAGES: dict[str, str] = dict.fromkeys(
    ("", "file"), "scrapy_ha.sinks.feeds.WrittenThroughFileFeedStorage"
)


def _add_components(
    settings: BaseSettings, name: str, components: Mapping[str, int | str | None]
) -> None:
    current = settings[name]
    for path, order in components.items():
        if path not in current:
            current[path] = order
