"""``scrapy-ha dashboard``: serve the web page of :mod:`scrapy_ha.dashboard`.

Safe by default: it binds 127.0.0.1; any other address needs a token (``--token`` or
``HA_DASHBOARD_TOKEN``), checked on every request. The web application needs the
``dashboard`` extra (``pip install 'scrapy-ha[dashboard]'``): it is imported only when the
command runs, so the CLI works without it.
"""

from __future__ import annotations

__all__ = ["dashboard"]

import errno
import logging
import os
import socket
import sys
from typing import TYPE_CHECKING, Any

from scrapy_ha.cli.grammar import LOOPBACK
from scrapy_ha.dashboard._guard import TOKEN_ENV, is_loopback_bind

if TYPE_CHECKING:
    import argparse

    from scrapy_ha.store.queue import RedisQueue


#: The fewest characters of a token (blanks aside): a token of one space was taken.
MIN_TOKEN = 1
#: Connections waiting to be accepted: uvicorn's own default.
BACKLOG = 2048


async def dashboard(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Serve the dashboard of every crawl under the prefix (http://127.0.0.1:9411/)."""
    token = args.token or os.environ.get(TOKEN_ENV) or None
    if token is not None and (len(token.strip()) < MIN_TOKEN or not token.isprintable()):
        print(
            f"error: the dashboard's token (--token or {TOKEN_ENV}) must be at least "
            f"{MIN_TOKEN} printable characters, not only spaces",
            file=sys.stderr,
        )
        return 2
    if not is_loopback_bind(args.host) and not token:
        print(
            f"error: --host {args.host} makes the dashboard reachable from other machines: "
            f"give it a token with --token or {TOKEN_ENV}, or bind {LOOPBACK}",
            file=sys.stderr,
        )
        return 2
    try:
        import uvicorn

        from scrapy_ha.dashboard.app import create_app
    except ImportError as exc:
        print(
            f"error: the dashboard needs the 'dashboard' extra ({exc.name} is missing): "
            f"pip install -e '/path/to/scrapy-ha[dashboard]' (scrapy-ha is not on PyPI)",
            file=sys.stderr,
        )
        return 2
    # the package's own lines (each action's: "dashboard: requeued 3 of 3 ..."), as the
    # metrics exporter prints them; uvicorn's loggers keep their handlers (no propagation)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    where = getattr(args, "where", None)
    app = create_app(queue.client, queue.keys.prefix, token=token, where=where)
    config = uvicorn.Config(
        _served(app), host=args.host, port=args.port, log_level="info", proxy_headers=False
    )
    try:
        socks = _listening(args.host, args.port)
    except OSError as exc:
        host = f"[{args.host}]" if ":" in args.host else args.host
        print(f"error: cannot listen on {host}:{args.port} ({_reason(exc)})", file=sys.stderr)
        return 2
    urls = " and ".join(_url(sock) for sock in socks)
    print(f"scrapy-ha dashboard on {urls}", flush=True)
    await uvicorn.Server(config).serve(sockets=socks)
    return 0


def _served(app: Any) -> Any:
    """*app* as uvicorn serves it: ``X-Forwarded-Proto`` of a proxy on 127.0.0.1 read (the
    scheme the origin check compares with a browser's ``Origin``), as uvicorn's default
    does, but ``X-Forwarded-For`` never: uvicorn took the client's address from it, and a
    guesser naming a new address with each wrong token was never throttled."""
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

    proxied = ProxyHeadersMiddleware(app, trusted_hosts="127.0.0.1")

    async def served(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            kept = [(k, v) for k, v in scope["headers"] if k.lower() != b"x-forwarded-for"]
            scope = {**scope, "headers": kept}
        await proxied(scope, receive, send)

    return served


def _listening(host: str, port: int) -> list[socket.socket]:
    """Sockets listening on *host* and *port*, bound by the CLI so that the port printed is
    the one bound (``--port 0``: one the system chose, the same for every address) and a
    browser opened at once waits in the backlog until the server accepts. As uvicorn's own
    server binds: every address *host* resolves to (``localhost``: 127.0.0.1 and ::1 where
    both are), an IPv6 one with IPV6_V6ONLY (``::`` is IPv6 alone; ``0.0.0.0`` IPv4
    alone). An address this machine does not have (``::1`` of ``localhost`` in a container
    without IPv6) is left out while another binds; a port in use is never left out. A host
    that does not resolve is an OSError that says so."""
    flags = socket.AI_PASSIVE | socket.AI_ADDRCONFIG
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=flags)
    except socket.gaierror as exc:
        raise OSError(f"cannot resolve {host}: {exc.strerror}") from exc
    socks: list[socket.socket] = []
    missing: OSError | None = None
    try:
        for family, address in dict.fromkeys((f[0], f[4]) for f in found):
            chosen = socks[0].getsockname()[1] if socks else port
            try:
                socks.append(_bound(family, (address[0], chosen, *address[2:])))
            except OSError as exc:
                if exc.errno not in ABSENT:
                    raise
                missing = missing or exc
    except OSError:
        for sock in socks:
            sock.close()
        raise
    if not socks and missing is not None:
        raise missing
    return socks


#: Why an address of the host cannot be bound because this machine lacks it, not because
#: something else holds it: such an address is left out when another binds.
ABSENT = frozenset({errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT})


def _bound(family: int, address: tuple[Any, ...]) -> socket.socket:
    """A socket of *family* bound to *address* and listening."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def _url(sock: socket.socket) -> str:
    """The dashboard's address on *sock* (``http://[::1]:9411/``)."""
    address, port = sock.getsockname()[:2]
    host = f"[{address}]" if sock.family == socket.AF_INET6 else address
    return f"http://{host}:{port}/"


def _reason(exc: OSError) -> str:
    """What the system said of a bind that failed ("Address already in use")."""
    return exc.strerror or str(exc)
