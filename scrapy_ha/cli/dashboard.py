"""``scrapy-ha dashboard``: serve the web page of :mod:`scrapy_ha.dashboard`.

Safe by default: it binds 127.0.0.1; any other address needs a token (``--token`` or
``HA_DASHBOARD_TOKEN``), checked on every request. The web application needs the
``dashboard`` extra (``pip install 'scrapy-ha[dashboard]'``): it is imported only when the
command runs, so the CLI works without it.
"""

from __future__ import annotations

__all__ = ["dashboard"]

import os
import socket
import sys
from typing import TYPE_CHECKING

from scrapy_ha.cli.grammar import LOOPBACK
from scrapy_ha.dashboard._guard import TOKEN_ENV, is_loopback_bind

if TYPE_CHECKING:
    import argparse

    from scrapy_ha.store.queue import RedisQueue


#: Connections waiting to be accepted: uvicorn's own default.
BACKLOG = 2048


async def dashboard(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Serve the dashboard of every crawl under the prefix (http://127.0.0.1:9411/)."""
    token = args.token or os.environ.get(TOKEN_ENV) or None
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
            f"pip install 'scrapy-ha[dashboard]'",
            file=sys.stderr,
        )
        return 2
    app = create_app(queue.client, queue.keys.prefix, token=token)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info")
    host = f"[{args.host}]" if ":" in args.host else args.host
    try:
        sock = _bound(args.host, args.port)
    except OSError as exc:
        print(f"error: cannot listen on {host}:{args.port} ({_reason(exc)})", file=sys.stderr)
        return 2
    print(f"scrapy-ha dashboard on http://{host}:{sock.getsockname()[1]}/", flush=True)
    await uvicorn.Server(config).serve(sockets=[sock])
    return 0


def _bound(host: str, port: int) -> socket.socket:
    """A socket bound to *host* and *port* and listening, so that the port printed is the
    one bound (``--port 0``: one the system chose), and a browser opened at once waits in
    its backlog until the server accepts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def _reason(exc: OSError) -> str:
    """What the system said of a bind that failed ("Address already in use")."""
    return exc.strerror or str(exc)
