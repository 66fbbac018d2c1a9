"""``scrapy-ha dashboard``: serve the web page of :mod:`scrapy_ha.dashboard`.

Safe by default: it binds 127.0.0.1; any other address needs a token (``--token`` or
``HA_DASHBOARD_TOKEN``), checked on every request. The web application needs the
``dashboard`` extra (``pip install 'scrapy-ha[dashboard]'``): it is imported only when the
command runs, so the CLI works without it.
"""

from __future__ import annotations

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "add_command", "dashboard"]

import os
import sys
from typing import TYPE_CHECKING, Any

from scrapy_ha.cli.common import command
from scrapy_ha.dashboard._guard import TOKEN_ENV, is_loopback_bind

if TYPE_CHECKING:
    import argparse

    from scrapy_ha.store.queue import RedisQueue

#: Loopback only: nothing outside this machine reaches a dashboard without a token.
DEFAULT_HOST = "127.0.0.1"
#: Next to the metrics exporter's 9410, so one firewall rule range covers both.
DEFAULT_PORT = 9411


async def dashboard(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Serve the dashboard of every crawl under the prefix (http://127.0.0.1:9411/)."""
    token = args.token or os.environ.get(TOKEN_ENV) or None
    if not is_loopback_bind(args.host) and not token:
        print(
            f"error: --host {args.host} makes the dashboard reachable from other machines: "
            f"give it a token with --token or {TOKEN_ENV}, or bind {DEFAULT_HOST}",
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
    print(f"scrapy-ha dashboard on http://{args.host}:{args.port}/", flush=True)
    await uvicorn.Server(config).serve()
    return 0


def add_command(sub: Any) -> argparse.ArgumentParser:
    """Register ``scrapy-ha dashboard`` on the CLI's subcommands."""
    parser = command(sub, "dashboard", dashboard, spider=False)
    parser.set_defaults(spider="")  # no crawl of its own: it shows every crawl
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind ({DEFAULT_HOST})")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port to listen on ({DEFAULT_PORT})"
    )
    parser.add_argument(
        "--token", help=f"required by every request; needed for a non-loopback --host ({TOKEN_ENV})"
    )
    return parser
