"""A paginated catalogue served on loopback: / -> list pages -> detail pages.

``python -m scrapy_ha.demo.site --pages 500 --per-page 20`` prints
``LISTENING <port>`` once it accepts connections. ``/list/<n>`` links to the
detail pages of its items and to the next list page; ``/item/<id>`` holds one
item; ``/`` links to the first list page of each of ``--chains`` pagination
chains. ``/status/<code>`` answers with that status, ``/redirect/<id>`` redirects
to ``/item/<id>``. ``/_hits`` returns how many times each path was served (JSON), for tests
that check nothing was crawled twice.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any

from twisted.internet import reactor
from twisted.web import resource, server


class Catalogue(resource.Resource):
    isLeaf = True

    def __init__(self, pages: int, per_page: int, delay: float, chains: int = 1) -> None:
        super().__init__()
        self.pages = pages
        self.chain_length = max(1, -(-pages // max(1, chains)))
        self.per_page = per_page
        self.delay = delay
        self.hits: Counter[str] = Counter()

    def render_GET(self, request: Any) -> bytes | int:
        path = request.path.decode()
        if path == "/_hits":
            request.setHeader(b"content-type", b"application/json")
            return json.dumps(self.hits).encode()
        self.hits[path] += 1
        if path.startswith("/redirect/"):
            request.redirect(b"/item/" + path.rsplit("/", 1)[1].encode())
            return b""
        status, body = self.page(path)
        request.setResponseCode(status)
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        if not self.delay:
            return body
        reactor.callLater(self.delay, _finish, request, body)  # type: ignore[attr-defined]
        return server.NOT_DONE_YET

    def page(self, path: str) -> tuple[int, bytes]:
        parts = path.strip("/").split("/")
        if path == "/":
            starts = range(1, self.pages + 1, self.chain_length)
            links = "".join(f'<a class="next" href="/list/{n}">from page {n}</a>' for n in starts)
            return 200, f"<html><body>{links}</body></html>".encode()
        if len(parts) == 2 and parts[1].isdigit():
            n = int(parts[1])
            if parts[0] == "status":
                return n, f"<html><body>status {n}</body></html>".encode()
            if parts[0] == "list" and 1 <= n <= self.pages:
                return 200, self.list_page(n)
            if parts[0] == "item" and 1 <= n <= self.pages * self.per_page:
                return 200, self.item_page(n)
        return 404, b"<html><body>not found</body></html>"

    def list_page(self, n: int) -> bytes:
        first = (n - 1) * self.per_page + 1
        links = "".join(
            f'<li><a class="item" href="/item/{i}">item {i}</a></li>'
            for i in range(first, first + self.per_page)
        )
        last = n == self.pages or n % self.chain_length == 0
        nxt = "" if last else f'<a class="next" href="/list/{n + 1}">next</a>'
        return f"<html><body><ul>{links}</ul>{nxt}</body></html>".encode()

    def item_page(self, n: int) -> bytes:
        return (
            f'<html><body><h1 class="name">Item {n}</h1>'
            f'<span class="id">{n}</span><span class="price">{n % 97}.99</span>'
            f"</body></html>"
        ).encode()


def _finish(request: Any, body: bytes) -> None:
    if not request._disconnected:
        request.write(body)
        request.finish()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--pages", type=int, default=50)
    parser.add_argument("--per-page", type=int, default=20)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument("--chains", type=int, default=1,
                        help="pagination chains: / links to the first page of each")
    args = parser.parse_args(argv)
    site = server.Site(Catalogue(args.pages, args.per_page, args.delay, args.chains))
    site.noisy = False
    port = reactor.listenTCP(args.port, site, interface="127.0.0.1")  # type: ignore[attr-defined]
    sys.stdout.write(f"LISTENING {port.getHost().port}\n")
    sys.stdout.flush()
    reactor.run()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
