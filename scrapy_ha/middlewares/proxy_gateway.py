"""Telling a pool proxy that answers 502 or 504 itself from a site that is down.

A forward proxy that cannot reach its own upstream (a dead exit, a broken provider node)
answers plain-HTTP requests with its own ``502 Bad Gateway`` or ``504 Gateway Timeout``:
a response, not a connection failure, so it was judged a ``server`` failure of the page
alone and the proxy stayed in rotation for ever, spending an attempt of every request it
was given. A site can answer 502 itself too (the site down, a broken page), and then no
proxy is at fault. So a proxy is held to blame for a site only when it answered
``HA_PROXY_MAX_FAILURES`` gateway errors in a row for that site, each for another URL (a
page that keeps failing is the page's failure), while another proxy got an answer from
the site since the first of them that is no server error (the site is up). Inside an HTTPS
request's CONNECT tunnel the proxy answers nothing but the CONNECT (a refusal is a
``TunnelError``, a connection failure): every status there is the site's own.

With ``HA_PROXY_ALLOW_DIRECT`` no other proxy is needed to tell: a tunnel has none, and
every proxy of a pool may be failing, so none would ever reach the site and the crawl
would never go direct (each page was dead-lettered after its retries through the proxy).
The row alone takes the proxy out for the site, whose requests go direct meanwhile: a site
that answers 502 itself to a proxy's plain-HTTP requests is then tried directly (it is
down, or its pages broken, either way: its pages are retried as before).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import urlsplit

from scrapy_ha.middlewares.proxy_sources import cooling_key

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["GATEWAY_STATUSES", "GatewayErrors"]

#: The statuses of a gateway or proxy that could not get an answer (RFC 9110, 15.6.3 and
#: 15.6.5).
GATEWAY_STATUSES = frozenset({502, 504})
#: The first status of a server error (RFC 9110, 15.6): a site that answers one is failing,
#: which says nothing of whether a proxy's own 502 is the proxy's (a site down behind a
#: gateway answers 502 for some pages and 503 for others, through every proxy).
SERVER_ERROR = 500
#: Sites and (proxy, site) runs remembered at most: a broad crawl's hosts do not pile up.
MAX_REMEMBERED = 10_000

_V = TypeVar("_V")


class GatewayErrors:
    """The gateway errors of each pool proxy, per site, in a row."""

    def __init__(
        self, max_failures: int, counted: Callable[[str], object], *, witness: bool = True
    ) -> None:
        self.max_failures = max_failures
        #: must another proxy have reached the site (no HA_PROXY_ALLOW_DIRECT)?
        self.witness = witness
        self.counted = counted  # told of each answer counted as a failure of the proxy
        self._reached: dict[str, float] = {}  # host -> when a proxy last got its answer
        #: cooling_key(proxy, host) -> (gateway errors in a row, since when, the last URL)
        self._runs: dict[str, tuple[int, float, str]] = {}

    def answer(self, pid: str, host: str, url: str, status: int) -> bool:
        """Record an answer of *status* to *url* through *pid*; True when the proxy is to
        be cooled down for *host*."""
        key, now = cooling_key(pid, host), time.monotonic()
        gateway = status in GATEWAY_STATUSES
        if not gateway or urlsplit(url).scheme != "http":
            self._runs.pop(key, None)  # it reached the site (HTTPS: the status is the site's)
            if status < SERVER_ERROR:  # (a site's own 502 or 503 does not say that it is up)
                _bounded(self._reached)[host] = now
            return False
        count, since, last = self._runs.get(key, (0, now, ""))
        if url == last:
            return False  # the same page again: its own failure, maybe
        count += 1
        self.counted(pid)
        reached = not self.witness or self._reached.get(host, -1.0) >= since
        if count >= self.max_failures and reached:
            self._runs.pop(key, None)
            return True
        _bounded(self._runs)[key] = (count, since, url)
        return False


def _bounded(mapping: dict[str, _V]) -> dict[str, _V]:
    if len(mapping) >= MAX_REMEMBERED:
        mapping.clear()
    return mapping
