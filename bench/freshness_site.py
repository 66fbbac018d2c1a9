"""A site whose pages change: the freshness benchmark's (docs/benchmarks.md, "Revisits").

``python bench/freshness_site.py --pages 1000 --compress 144`` prints ``LISTENING PORT``.
Page ``/p/<i>`` changes as a Poisson process at its own rate, the rates spread evenly on a
log scale from once every ``--min-period`` to once every ``--max-period`` simulated seconds
(a minute to a day by default), time compressed ``--compress`` times (144: a day in 10
real minutes); ``/`` links to every page. The change times are drawn once, from ``--seed``,
for ``--horizon`` real seconds after the start. A page answers with its version in its body,
an ``ETag`` (``"<page>-<version>"``) and a ``Last-Modified`` (its last change), and honours
conditional requests: ``If-None-Match`` first, else ``If-Modified-Since`` (RFC 9110): 304
without a body (``--no-conditional`` answers 200 always). ``--static`` pages change only when
``/_change?page=<i>`` asks (for tests); ``/_fail?page=<i>&status=<code>`` makes a page
answer that status from then on (``status=0``: as before; a 3xx redirects to ``/gone/<i>``,
a page that answers 404: a page removed, or to ``&to=<path>``; ``/v/<i>`` is page ``<i>``
under another URL, logged as it is).

``/_stats?since=<t>&until=<t>`` (real seconds since the start, ``until`` default now) reads
the fetch log: ``freshness``, the time-averaged fraction of pages whose last fetched copy
equals the live page (Cho and Garcia-Molina; a page never fetched yet is not fresh; a 304
confirms the copy as a 200 does), ``fetches``, ``not_modified`` (304s), ``unchanged`` (fetches
of a page that had not changed since the fetch before), ``unchanged_304`` (of those, the 304s),
``bytes`` sent; and per page its rate, fetches and the shortest and longest gap between two
fetches. ``/_log`` is the whole fetch log: ``[t, page, status, version]``.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import random
import sys
import time
from email.utils import formatdate, parsedate_to_datetime
from typing import Any

from twisted.internet import reactor
from twisted.web import resource, server

#: Bytes of filler per page: a page of a few KB, so that a 304 saves something worth counting.
FILLER = 4000


class ChangingSite(resource.Resource):
    isLeaf = True  # noqa: N815 (Twisted's name)

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.pages = args.pages
        self.conditional = not args.no_conditional
        self.start = time.time()
        rng = random.Random(args.seed)
        low, high = math.log(1 / args.max_period), math.log(1 / args.min_period)
        #: changes per real second of each page
        self.rates = [math.exp(rng.uniform(low, high)) * args.compress for _ in range(self.pages)]
        #: real seconds since the start at which each page changed
        self.changes: list[list[float]] = [[] for _ in range(self.pages)]
        if not args.static:
            for i, rate in enumerate(self.rates):
                t = rng.expovariate(rate)
                while t < args.horizon:
                    self.changes[i].append(t)
                    t += rng.expovariate(rate)
        #: (t, page, status, version, bytes)
        self.log: list[tuple[float, int, int, int, int]] = []
        #: page -> the status it answers instead of itself (/_fail)
        self.failing: dict[int, int] = {}
        #: page -> where its 3xx sends (/_fail's to=; /gone/<page> if not said)
        self.moved: dict[int, str] = {}

    def now(self) -> float:
        return time.time() - self.start

    def version(self, page: int, t: float) -> int:
        return bisect.bisect_right(self.changes[page], t)

    def render_GET(self, request: Any) -> bytes:  # noqa: N802 (Twisted's name)
        path = request.path.decode()
        if path.startswith("/p/"):
            return self.page(request, int(path[3:]))
        if path.startswith("/v/"):  # the page under another URL: never failing
            return self.page(request, int(path[3:]), alias=True)
        if path == "/":
            links = "".join(f'<a href="/p/{i}">{i}</a> ' for i in range(self.pages))
            return f"<html><body>{links}</body></html>".encode()
        if path == "/_change":
            page = int(request.args[b"page"][0])
            self.changes[page].append(self.now())
            return b"changed"
        if path == "/_fail":
            page, status = (int(request.args[name][0]) for name in (b"page", b"status"))
            self.failing[page] = status
            if b"to" in request.args:
                self.moved[page] = request.args[b"to"][0].decode()
            return b"failing" if status else b"as before"
        if path == "/_log":
            return json.dumps([x[:4] for x in self.log]).encode()
        if path == "/_stats":
            since = float(request.args.get(b"since", [b"0"])[0])
            until = float(request.args.get(b"until", [str(self.now()).encode()])[0])
            return json.dumps(self.stats(since, until)).encode()
        request.setResponseCode(404)
        return b"not found"

    def page(self, request: Any, page: int, *, alias: bool = False) -> bytes:
        t = self.now()
        version = self.version(page, t)
        if self.failing.get(page) and not alias:
            request.setResponseCode(self.failing[page])
            if 300 <= self.failing[page] < 400:
                location = self.moved.get(page, f"/gone/{page}")
                request.setHeader(b"Location", location.encode())
            self.log.append((t, page, self.failing[page], version, 0))
            return b"failing"
        changed = self.changes[page][version - 1] if version else 0.0
        etag = f'"{page}-{version}"'
        modified = formatdate(self.start + changed, usegmt=True)
        request.setHeader(b"ETag", etag.encode())
        request.setHeader(b"Last-Modified", modified.encode())
        if self.conditional and _not_modified(request, etag, self.start + changed):
            request.setResponseCode(304)
            self.log.append((t, page, 304, version, 0))
            return b""
        body = (
            f"<html><body><h1>page {page}</h1><p>version {version}</p>"
            f"<p>{'x' * FILLER}</p></body></html>"
        ).encode()
        self.log.append((t, page, 200, version, len(body)))
        return body

    def stats(self, since: float, until: float) -> dict[str, Any]:
        fetched: list[list[tuple[float, int, int]]] = [[] for _ in range(self.pages)]
        counts = {"fetches": 0, "not_modified": 0, "unchanged": 0, "unchanged_304": 0, "bytes": 0}
        for t, page, status, version, size in self.log:
            if t > until:
                break
            if t >= since:
                counts["fetches"] += 1
                counts["not_modified"] += status == 304
                counts["bytes"] += size
                before = fetched[page][-1] if fetched[page] else None
                if before is not None and before[2] == version:
                    counts["unchanged"] += 1
                    counts["unchanged_304"] += status == 304
            fetched[page].append((t, status, version))
        fresh = sum(self._fresh(i, fetched[i], since, until) for i in range(self.pages))
        pages = []
        for i, times in enumerate(fetched):
            inside = [f[0] for f in times if since <= f[0] <= until]
            gaps = [b - a for a, b in zip(inside, inside[1:], strict=False)]
            pages.append(
                {
                    "rate": self.rates[i],
                    "fetches": len(inside),
                    "min_gap": min(gaps, default=None),
                    "max_gap": max(gaps, default=None),
                    "first": inside[0] if inside else None,
                    "last": inside[-1] if inside else None,
                }
            )
        span = max(until - since, 1e-9)
        return {**counts, "freshness": fresh / (self.pages * span), "pages": pages}

    def _fresh(self, page: int, fetches: list[tuple[float, int, int]], a: float, b: float) -> float:
        """Seconds of [a, b] during which the last fetched copy of *page* was the live one."""
        total = 0.0
        for k, (t, _, version) in enumerate(fetches):
            end = fetches[k + 1][0] if k + 1 < len(fetches) else b
            changes = self.changes[page]
            stale = changes[version] if version < len(changes) else math.inf
            lo, hi = max(t, a), min(end, stale, b)
            if hi > lo:
                total += hi - lo
        return total


def _not_modified(request: Any, etag: str, changed: float) -> bool:
    match = request.getHeader(b"If-None-Match")
    if match is not None:
        return etag in [m.strip() for m in match.decode().split(",")] or match.strip() == b"*"
    since = request.getHeader(b"If-Modified-Since")
    if since is None:
        return False
    try:
        return math.floor(changed) <= parsedate_to_datetime(since.decode()).timestamp()
    except (TypeError, ValueError):
        return False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--pages", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--compress", type=float, default=144.0, help="simulated s per real s")
    parser.add_argument("--min-period", type=float, default=60.0, help="simulated seconds")
    parser.add_argument("--max-period", type=float, default=86400.0, help="simulated seconds")
    parser.add_argument("--horizon", type=float, default=4 * 3600.0, help="real seconds")
    parser.add_argument("--static", action="store_true", help="change only on /_change")
    parser.add_argument("--no-conditional", action="store_true", help="never answer 304")
    args = parser.parse_args(argv)
    site = server.Site(ChangingSite(args))  # type: ignore[no-untyped-call]
    site.noisy = False
    port = reactor.listenTCP(args.port, site, interface="127.0.0.1")  # type: ignore[attr-defined]
    sys.stdout.write(f"LISTENING {port.getHost().port}\n")
    sys.stdout.flush()
    reactor.run()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
