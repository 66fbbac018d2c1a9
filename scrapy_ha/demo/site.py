"""A paginated catalogue served on loopback: / -> list pages -> detail pages.

``python -m scrapy_ha.demo.site --pages 500 --per-page 20`` prints ``LISTENING <port>``
once it accepts connections. ``/list/<n>`` links to the detail pages of its items and to
the next list page; ``/item/<id>`` holds one item; ``/`` links to the first list page of
each of ``--chains`` pagination chains. ``/status/<code>`` answers with that status,
``/redirect/<id>`` redirects to ``/item/<id>`` (302; ``/moved/<id>``: 301; ``/chain/<id>``:
302 to ``/moved/<id>``).
``/flaky/<id>?fail=N&status=S[&retry_after=R][&delay=D]`` fails its first N hits with status
S (a number, ``timeout`` or ``broken`` for a page the parser cannot read; answered D seconds
late), then serves item <id>. ``/_hits`` returns how many times each path was served and
``/_log`` every hit as [time, path, client address] (JSON), for tests. ``--ban-exit IP``
answers 403 to one client address (a proxy exit); ``--tls`` serves HTTPS; ``--interface``
listens on another loopback address (another host for a crawl);
``/proxies.json`` serves ``--proxy-list`` as a proxy extraction API.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from twisted.internet import reactor as _reactor
from twisted.web import resource, server

if TYPE_CHECKING:
    from collections.abc import Callable


class _Reactor(Protocol):
    """What the site uses of Twisted's global reactor (a module attribute mypy cannot type)."""

    def callLater(self, delay: float, f: Callable[..., object], *args: Any) -> Any: ...
    def listenTCP(self, port: int, factory: Any, interface: str = "") -> Any: ...
    def listenSSL(self, port: int, factory: Any, context: Any, interface: str = "") -> Any: ...
    def run(self) -> None: ...


reactor = cast("_Reactor", _reactor)


@dataclass(frozen=True)
class Fault:
    """Item pages whose id is a multiple of ``every`` fail their first ``times`` hits."""

    status: str  # an HTTP status, "timeout" or "broken"
    every: int
    times: int
    retry_after: int = 0

    @classmethod
    def parse(cls, text: str) -> Fault:
        """``STATUS:EVERY:TIMES[:RETRY_AFTER]``, e.g. ``503:7:2`` or ``429:13:1:2``."""
        parts = text.split(":")
        return cls(parts[0], int(parts[1]), int(parts[2]), int(parts[3]) if len(parts) > 3 else 0)

    def expected(self, budget: int) -> str | None:
        """None if a crawl with *budget* retries for this class ends with the item."""
        return None if self.times <= budget else self.status


class Catalogue(resource.Resource):
    isLeaf = True

    def __init__(
        self,
        pages: int,
        per_page: int,
        delay: float,
        chains: int = 1,
        faults: list[Fault] | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # Twisted's Resource is unannotated
        self.faults = faults or []
        self.banned_exits: set[str] = set()
        self.proxy_list: list[str] = []
        self.proxy_json: str | None = None
        self.proxy_api_auth: str | None = None
        self.proxy_api_hang_after: int | None = None
        self.slow: dict[str, float] = {}  # path -> seconds before its first answer
        self.pages = pages
        self.chain_length = max(1, -(-pages // max(1, chains)))
        self.per_page = per_page
        self.delay = delay
        self.hits: Counter[str] = Counter()
        self.log: list[list[Any]] = []

    def render_GET(self, request: Any) -> bytes | int:
        path = request.path.decode()
        if path in ("/_hits", "/_log"):
            request.setHeader(b"content-type", b"application/json")
            return json.dumps(self.hits if path == "/_hits" else self.log).encode()
        key = request.uri.decode()
        client = request.getClientAddress().host
        self.hits[key] += 1
        self.log.append([time.time(), key, client])
        if path in self.slow and self.hits[key] == 1:
            reactor.callLater(self.slow[path], _finish, request, self.page(path)[1])
            return server.NOT_DONE_YET
        if path == "/proxies.json":  # a proxy extraction API for the pool mode
            return self.proxy_api(request, self.hits[key])
        if client in self.banned_exits:
            request.setResponseCode(403)
            return b"<html><body>banned</body></html>"
        if path.startswith("/flaky/") and self.hits[key] <= _arg(request, "fail", 0):
            return self.fault(request)
        if self.faults and path.startswith("/item/") and (fault := self.fault_of(path)):
            if self.hits[key] <= fault.times:
                request.args = {b"status": [fault.status.encode()]}
                if fault.retry_after:
                    request.args[b"retry_after"] = [str(fault.retry_after).encode()]
                return self.fault(request)
        if path.startswith(("/redirect/", "/moved/", "/chain/")):  # 302, 301 (for good), 302
            to = b"/moved/" if path.startswith("/chain/") else b"/item/"
            request.redirect(to + path.rsplit("/", 1)[1].encode())
            request.setResponseCode(301 if path.startswith("/moved/") else 302)
            return b""
        status, body = self.page(path)
        request.setResponseCode(status)
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        if not self.delay:
            return body
        reactor.callLater(self.delay, _finish, request, body)
        return server.NOT_DONE_YET

    def proxy_api(self, request: Any, hit: int) -> bytes | int:
        """``/proxies.json``: ``--proxy-list`` as ``{"ip", "port"}`` objects, or
        ``--proxy-json`` as it is; Basic auth if ``--proxy-api-auth``; no answer at all
        after ``--proxy-api-hang-after`` answers (a hung API)."""
        if self.proxy_api_hang_after is not None and hit > self.proxy_api_hang_after:
            reactor.callLater(3600, _finish, request, b"")
            return server.NOT_DONE_YET
        if self.proxy_api_auth is not None:
            expected = b"Basic " + base64.b64encode(self.proxy_api_auth.encode())
            if request.getHeader(b"authorization") != expected:
                request.setResponseCode(401)
                return b"unauthorized"
        request.setHeader(b"content-type", b"application/json")
        if self.proxy_json is not None:
            return self.proxy_json.encode()
        return json.dumps(
            [{"ip": p.split(":")[0], "port": int(p.split(":")[1])} for p in self.proxy_list]
        ).encode()

    def fault_of(self, path: str) -> Fault | None:
        n = int(path.rsplit("/", 1)[1]) if path.rsplit("/", 1)[1].isdigit() else 0
        return next((f for f in self.faults if n and n % f.every == 0), None)

    def fault(self, request: Any) -> bytes | int:
        """The failure a /flaky/ page answers with until it has failed ``fail`` times."""
        status = request.args.get(b"status", [b"500"])[0].decode()
        if status == "timeout":
            reactor.callLater(3600, _finish, request, b"")
            return server.NOT_DONE_YET
        if status == "broken":  # a page the parser cannot read
            return b"<html><body><h1>maintenance</h1></body></html>"
        request.setResponseCode(int(status))
        retry_after = request.args.get(b"retry_after")
        if retry_after:
            request.setHeader(b"retry-after", retry_after[0])
        body = f"<html><body>status {status}</body></html>".encode()
        if (delay := _arg(request, "delay", 0)) > 0:  # answered late: others arrive meanwhile
            reactor.callLater(delay, _finish, request, body)
            return server.NOT_DONE_YET
        return body

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
            if parts[0] == "flaky":
                return 200, self.item_page(n)
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


def _arg(request: Any, name: str, default: int) -> int:
    return int(request.args.get(name.encode(), [default])[0])


def _finish(request: Any, body: bytes) -> None:
    if not request._disconnected:
        request.write(body)
        request.finish()


def _tls_options() -> Any:
    """A throw-away self-signed certificate for 127.0.0.1 (Scrapy does not verify it)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    from OpenSSL import crypto
    from twisted.internet import ssl

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .sign(key, hashes.SHA256())
    )
    return ssl.CertificateOptions(
        privateKey=crypto.PKey.from_cryptography_key(key),
        certificate=crypto.X509.from_cryptography(cert),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--pages", type=int, default=50)
    parser.add_argument("--per-page", type=int, default=20)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument(
        "--chains", type=int, default=1, help="pagination chains: / links to the first page of each"
    )
    parser.add_argument(
        "--fault",
        action="append",
        type=Fault.parse,
        default=[],
        metavar="STATUS:EVERY:TIMES[:RETRY_AFTER]",
        help="item pages whose id is a multiple of EVERY answer STATUS (a code, "
        "timeout or broken) to their first TIMES hits",
    )
    parser.add_argument(
        "--ban-exit",
        action="append",
        default=[],
        metavar="IP",
        help="answer 403 to every request from this client address",
    )
    parser.add_argument("--tls", action="store_true", help="serve HTTPS (self-signed)")
    parser.add_argument(
        "--interface",
        default="127.0.0.1",
        help="the loopback address to listen on (127.0.0.1; another one is another host)",
    )
    parser.add_argument(
        "--slow-list",
        action="append",
        default=[],
        metavar="N:SECONDS",
        help="list page N answers its first hit after SECONDS",
    )
    parser.add_argument(
        "--proxy-list",
        default="",
        metavar="IP:PORT,...",
        help="what /proxies.json serves (a proxy pool API)",
    )
    parser.add_argument("--proxy-json", help="what /proxies.json serves, as it is")
    parser.add_argument(
        "--proxy-api-auth", metavar="USER:PASSWORD", help="/proxies.json wants this Basic auth"
    )
    parser.add_argument(
        "--proxy-api-hang-after",
        type=int,
        metavar="N",
        help="/proxies.json answers N times, then never again (a hung API)",
    )
    args = parser.parse_args(argv)
    catalogue = Catalogue(args.pages, args.per_page, args.delay, args.chains, args.fault)
    catalogue.banned_exits = set(args.ban_exit)
    catalogue.proxy_list = [p for p in args.proxy_list.split(",") if p]
    catalogue.proxy_json = args.proxy_json
    catalogue.proxy_api_auth = args.proxy_api_auth
    catalogue.proxy_api_hang_after = args.proxy_api_hang_after
    catalogue.slow = {f"/list/{n}": float(t) for n, t in (x.split(":") for x in args.slow_list)}
    site = server.Site(catalogue)  # type: ignore[no-untyped-call]  # Twisted's Site is unannotated
    site.noisy = False
    if args.tls:
        port = reactor.listenSSL(args.port, site, _tls_options(), interface=args.interface)
    else:
        port = reactor.listenTCP(args.port, site, interface=args.interface)
    sys.stdout.write(f"LISTENING {port.getHost().port}\n")
    sys.stdout.flush()
    reactor.run()


if __name__ == "__main__":
    main()
