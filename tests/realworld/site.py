"""A small shop on loopback, the kind of site everyday Scrapy spiders are written against.

``python tests/realworld/site.py`` prints ``LISTENING <port>`` once it accepts connections.

- ``/products?page=N``: 6 pages of 10 products, each linking ``/product/<id>`` and the next page;
- ``/login`` (GET: a form with a CSRF token; POST: sets the ``session`` cookie and redirects to
  ``/account``); ``/account/orders?page=N`` and ``/account/order/<id>``: 40 orders, 403 without
  the session cookie;
- ``POST /api/products`` with a JSON body ``{"page": N}``: 12 pages of 10 products as JSON, each
  page naming one related page (``/product/<id>``; one of them is gone: 404);
- ``/sitemap.xml`` (a sitemap index) -> ``/sitemap-products.xml`` and ``/sitemap-docs.xml``;
- ``/docs/`` and ``/docs/<n>``: 15 documentation pages linked in a chain and from the index;
- ``/flaky/<n>``: fails its first hit with 503, then serves product <n>;
- ``/robots.txt`` allows everything (the startproject template obeys robots.txt).
"""

from __future__ import annotations

import json
import secrets
import socket
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

PRODUCTS = 60
PER_PAGE = 10
ORDERS = 40
API_PAGES = 12
DOCS = 15
JSON = "application/json"
SITEMAP_NS = "http://www.sitemaps.org/schemas/sitemap/0.9"
#: The related page of this API page is gone (the errback's case).
API_GONE_PAGE = 7


class Shop:
    """State shared by the handler threads: sessions, CSRF tokens and hit counts."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sessions: set[str] = set()
        self.csrf: set[str] = set()
        self.hits: Counter[str] = Counter()

    def hit(self, path: str) -> int:
        with self.lock:
            self.hits[path] += 1
            return self.hits[path]


SHOP = Shop()


def _html(body: str) -> bytes:
    return f"<html><head><title>shop</title></head><body>{body}</body></html>".encode()


def products_page(page: int) -> bytes:
    first = (page - 1) * PER_PAGE + 1
    rows = "".join(
        f'<li class="product"><a href="/product/{i}">Product {i}</a>'
        f'<span class="price">{i}.50</span></li>'
        for i in range(first, min(first + PER_PAGE, PRODUCTS + 1))
    )
    more = first + PER_PAGE <= PRODUCTS
    nxt = f'<a class="next" href="/products?page={page + 1}">next</a>' if more else ""
    return _html(f"<ul>{rows}</ul>{nxt}")


def product_page(n: int) -> bytes:
    return _html(
        f'<h1 class="name">Product {n}</h1><span class="sku">SKU-{n:04d}</span>'
        f'<span class="stock">{n % 7}</span>'
    )


def orders_page(page: int) -> bytes:
    first = (page - 1) * PER_PAGE + 1
    rows = "".join(
        f'<li><a class="order" href="/account/order/{i}">order {i}</a></li>'
        for i in range(first, min(first + PER_PAGE, ORDERS + 1))
    )
    more = first + PER_PAGE <= ORDERS
    nxt = f'<a class="next" href="/account/orders?page={page + 1}">next</a>' if more else ""
    return _html(f"<ul>{rows}</ul>{nxt}")


def docs_page(n: int) -> bytes:
    nxt = f'<a class="next" href="/docs/{n + 1}">next</a>' if n < DOCS else ""
    return _html(f'<h1 class="title">Doc {n}</h1><a href="/docs/">index</a>{nxt}')


def docs_index() -> bytes:
    return _html("".join(f'<a href="/docs/{n}">doc {n}</a>' for n in range(1, DOCS + 1, 5)))


def sitemap(urls: list[str], index: bool = False) -> bytes:
    tag, inner = ("sitemapindex", "sitemap") if index else ("urlset", "url")
    body = "".join(f"<{inner}><loc>{u}</loc></{inner}>" for u in urls)
    head = '<?xml version="1.0" encoding="UTF-8"?>'
    return f'{head}<{tag} xmlns="{SITEMAP_NS}">{body}</{tag}>'.encode()


def api_page(page: int) -> dict[str, Any]:
    first = (page - 1) * PER_PAGE + 1
    items = [{"id": i, "name": f"API product {i}"} for i in range(first, first + PER_PAGE)]
    related = 10_000 + page if page == API_GONE_PAGE else page
    return {
        "items": items,
        "related": [f"/product/{related}"],
        "next": page + 1 if page < API_PAGES else None,
    }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        """Headers and body go out as two writes: without TCP_NODELAY each keep-alive answer
        waits for the client's delayed ACK (about 40 ms)."""
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        """Quiet: tests read the hit counts instead."""

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        page = int(query.get("page", ["1"])[0])
        SHOP.hit(self.path)
        self._route_get(url.path, page)

    def _route_get(self, path: str, page: int) -> None:  # noqa: C901 (one branch per route)
        base = f"http://{self.headers['Host']}"
        parts = path.strip("/").split("/")
        last = parts[-1]
        number = int(last) if last.isdigit() else 0
        if path == "/robots.txt":
            return self._send(200, b"User-agent: *\nAllow: /\n", "text/plain")
        if path == "/products" and 1 <= page <= -(-PRODUCTS // PER_PAGE):
            return self._send(200, products_page(page))
        if parts[0] == "product" and 1 <= number <= PRODUCTS:
            return self._send(200, product_page(number))
        if parts[0] == "flaky" and number:
            if SHOP.hit(f"fail:{number}") == 1:
                return self._send(503, _html("try again"))
            return self._send(200, product_page(number))
        if path == "/login":
            token = secrets.token_hex(8)
            with SHOP.lock:
                SHOP.csrf.add(token)
            form = (
                f'<form action="/login" method="post"><input type="hidden" name="csrf" '
                f'value="{token}"><input name="user"><input name="password" type="password">'
                f'<input type="submit" value="Log in"></form>'
            )
            return self._send(200, _html(form))
        if parts[0] == "account":
            return self._account(path, page)
        if path == "/sitemap.xml":
            parts = [f"{base}/sitemap-products.xml", f"{base}/sitemap-docs.xml"]
            return self._send(200, sitemap(parts, index=True), "text/xml")
        if path == "/sitemap-products.xml":
            urls = [f"{base}/product/{n}" for n in range(1, PRODUCTS + 1)]
            return self._send(200, sitemap(urls), "text/xml")
        if path == "/sitemap-docs.xml":
            urls = [f"{base}/docs/{n}" for n in range(1, DOCS + 1)]
            return self._send(200, sitemap(urls), "text/xml")
        if path in ("/docs", "/docs/"):
            return self._send(200, docs_index())
        if parts[0] == "docs" and 1 <= number <= DOCS:
            return self._send(200, docs_page(number))
        return self._send(404, _html("not found"))

    def _account(self, path: str, page: int) -> None:
        if not self._logged_in():
            return self._send(403, _html("please log in"))
        if path == "/account":
            return self._send(200, _html('<a href="/account/orders?page=1">orders</a>'))
        if path == "/account/orders" and 1 <= page <= ORDERS // PER_PAGE:
            return self._send(200, orders_page(page))
        last = path.rsplit("/", 1)[1]
        if path.startswith("/account/order/") and last.isdigit() and 1 <= int(last) <= ORDERS:
            return self._send(200, _html(f'<h1 class="order">Order {last}</h1>'))
        return self._send(404, _html("not found"))

    def _logged_in(self) -> bool:
        cookies = dict(
            part.strip().split("=", 1)
            for part in (self.headers.get("Cookie") or "").split(";")
            if "=" in part
        )
        with SHOP.lock:
            return cookies.get("session") in SHOP.sessions

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        path = urlsplit(self.path).path
        SHOP.hit(f"POST {self.path} {body.decode(errors='replace')}")
        if path == "/login":
            return self._login(body)
        if path == "/api/products":
            try:
                page = int(json.loads(body)["page"])
            except (ValueError, KeyError, TypeError):
                return self._send(400, b'{"error": "expected {\\"page\\": N}"}', JSON)
            if not 1 <= page <= API_PAGES:
                return self._send(404, b'{"error": "no such page"}', JSON)
            return self._send(200, json.dumps(api_page(page)).encode(), JSON)
        return self._send(404, _html("not found"))

    def _login(self, body: bytes) -> None:
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        with SHOP.lock:
            valid = form.get("csrf") in SHOP.csrf and form.get("user") == "alice"
            session = secrets.token_hex(16)
            if valid:
                SHOP.sessions.add(session)
        if not valid:
            return self._send(403, _html("bad login"))
        self.send_response(302)
        self.send_header("Location", "/account")
        self.send_header("Set-Cookie", f"session={session}; Path=/; HttpOnly")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _send(self, status: int, body: bytes, ctype: str = "text/html; charset=utf-8") -> None:
        """Answer with *body* (always with a length: connections are kept alive)."""
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    sys.stdout.write(f"LISTENING {server.server_address[1]}\n")
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
