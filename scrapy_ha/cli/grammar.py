"""The ``scrapy-ha`` command line: every subcommand, its options and its help, and nothing
else, so that ``--help``, ``--version`` and a usage error import neither Scrapy nor redis
(a tenth of a second instead of more than one).

Each subcommand names the function that runs it as a :class:`~.options.Target` (module and name),
imported only once the line is parsed. Every subcommand's help lists the options every
command takes (``--redis-url``, ``--prefix``, and ``--shards`` for a command on one
crawl), which are accepted before or after the subcommand.
"""

from __future__ import annotations

__all__ = ["build_parser", "parse"]

import argparse
import sys
from typing import Any

from scrapy_ha._version import __version__
from scrapy_ha.cli.continuous import seen_commands
from scrapy_ha.cli.items_grammar import items_command
from scrapy_ha.cli.options import (
    CRAWL_OPTIONS,
    PORT,
    at,
    bulk_options,
    command,
    create_option,
    group,
    parse_window,
    positive,
    seconds_from,
    when,
    whole,
)
from scrapy_ha.dashboard._guard import TOKEN_ENV

#: Seconds between two refreshes of ``status --watch`` without a value: a terminal stays
#: calm and a crawl of a few hundred pages per second still moves visibly.
WATCH_SECONDS = 2.0
#: The shortest refresh of ``status --watch``: ten a second, each a few Redis round trips.
WATCH_MIN_SECONDS = 0.1
#: Domains ``status`` shows (``--domains``): a screenful with the rest of the status.
TOP_DOMAINS = 10
#: The window of ``report`` unless told: the day a daily check looks back on.
REPORT_WINDOW = "24h"
#: Port of the metrics exporter: 9410 is unassigned in Prometheus's list of default ports.
METRICS_PORT = 9410
#: Address the exporter and the dashboard listen on: local only, unless opened on purpose.
LOOPBACK = "127.0.0.1"
#: Seconds one Redis call of a scrape may take before it answers ``redis_up 0``: well
#: inside Prometheus's default scrape timeout of 10 s.
METRICS_TIMEOUT = 3.0
#: Seconds between two scans of the key space for new crawls: a SCAN walks every key
#: (about 1.5 s for 200,000 keys on a loaded 2-core machine), so not on every scrape at the
#: usual 15 s interval; a new crawl shows up within a minute.
METRICS_RESCAN = 60.0
#: Port of the dashboard: next to the exporter's, so one firewall rule covers both.
DASHBOARD_PORT = 9411
#: The SQL archive's table unless told (``scrapy_ha.deadletters.archive.DEFAULT_TABLE``).
ARCHIVE_TABLE = "scrapy_ha_dead_letters"


# -- the subcommands -----------------------------------------------------------------------


def _status(sub: Any) -> None:
    parser = command(
        sub,
        "status",
        at("status", "status"),
        "states, totals, retries and dead letters per class, rates, an ETA, top domains",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object (one per refresh)")
    parser.add_argument(
        "--watch",
        nargs="?",
        type=seconds_from(WATCH_MIN_SECONDS),
        const=WATCH_SECONDS,
        metavar="SECONDS",
        help=f"refresh every SECONDS (default {WATCH_SECONDS:g}, at least "
        f"{WATCH_MIN_SECONDS:g}) until Ctrl-C",
    )
    parser.add_argument(
        "--domains",
        type=whole(0),
        default=TOP_DOMAINS,
        metavar="N",
        help=f"the N domains with the most acks (default {TOP_DOMAINS}; 0: none)",
    )


def _crawl_commands(sub: Any) -> None:
    flush = command(
        sub,
        "flush",
        at("flush", "flush"),
        "delete every key of the crawl but its checkpoints, dead-letter queue included "
        "(`checkpoints reset SPIDER --all` deletes those); refused while workers live",
    )
    flush.add_argument("--force", action="store_true", help="even while workers are alive")
    bulk_options(flush)
    command(
        sub,
        "workers",
        at("workers", "workers"),
        "each live worker: host, pid, scrapyd job, last heartbeat, leases held, pages/s",
    ).add_argument("--json", action="store_true", help="a JSON list, one object per worker")
    push = command(
        sub,
        "push",
        at("push", "push"),
        "add requests: URLs or JSON objects (url, callback, errback, priority, meta, method, "
        "headers, body, dont_filter), or one a line from stdin with -; the crawl's dupefilter "
        "applies",
    )
    push.add_argument(
        "requests", nargs="+", metavar="REQUEST", help="a URL or a JSON object; - reads stdin"
    )
    create_option(push, "push")
    pause = command(
        sub,
        "pause",
        at("pause", "pause"),
        "workers lease nothing new: they finish what they hold, keep their leases renewed "
        "and stay open until `resume`",
    )
    create_option(pause, "pause (so that workers started later wait)")
    command(sub, "resume", at("pause", "resume"), "workers lease again at their next sync")
    command(
        sub,
        "stop",
        at("stop", "stop"),
        "every worker running now closes within HA_LEASE_RENEW_INTERVAL (finish reason "
        "stopped), giving back what it holds; the crawl stays in Redis, workers started later run",
    )


def _delayed(sub: Any) -> None:
    delayed = group(sub, "delayed", "retries and held-back requests waiting for their time")
    listing = command(
        delayed,
        "list",
        at("delayed", "delayed_list"),
        "what waits, soonest first: id, due time, why (a retry's class, or a closed domain "
        "gate), attempts so far, URL",
    )
    _delayed_filters(listing)
    listing.add_argument("--limit", type=whole(1), help="at most this many")
    retry = command(
        delayed,
        "retry-now",
        at("delayed", "delayed_retry_now"),
        "make delayed entries due now (IDs, --all, --class, --domain): the next sync of any "
        "worker promotes them to the queue",
    )
    retry.add_argument("ids", nargs="*", metavar="ID", help="entry ids (see `delayed list`)")
    retry.add_argument("--all", action="store_true", help="every delayed entry")
    _delayed_filters(retry)
    bulk_options(retry)


def _gates(sub: Any) -> None:
    gates = group(sub, "gates", "domains a 429 closed for every worker (Retry-After)")
    command(
        gates,
        "list",
        at("gates", "gates_list"),
        "the gates closed now, soonest open first: domain, when it opens, requests waiting",
    )
    opening = command(
        gates,
        "open",
        at("gates", "gates_open"),
        "open gates now (DOMAIN..., or --all): each worker opens its copy at its next sync, and "
        "what waited behind them goes at once; a site still limiting closes its gate again",
    )
    opening.add_argument("domains", nargs="*", metavar="DOMAIN", help="as `gates list` names it")
    opening.add_argument("--all", action="store_true", help="every gate closed now")
    bulk_options(opening)


def _delayed_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--class",
        dest="failure_class",
        help="failure class (server, network, ...) or why it waits: gate, limit, revisit, proxy, "
        "dictionary",
    )
    parser.add_argument("--domain", type=str.lower, help="the request's host name")


def _dlq_filters(p: argparse.ArgumentParser, *, ids: bool = False, limit: bool = False) -> None:
    if ids:
        p.add_argument("ids", nargs="*", metavar="ID", help="entry ids (see `dlq list`)")
        p.add_argument("--all", action="store_true", help="every entry")
    p.add_argument("--class", dest="failure_class", help="failure class: gone, banned, server, ...")
    # (a host name is case-insensitive: the dashboard's filter took SHOP.Example, dlq none)
    p.add_argument("--domain", type=str.lower, help="the request's host name")
    p.add_argument("--status", type=int, help="the HTTP status of the last attempt: 404, 503, ...")
    p.add_argument("--reason", help="a part of the reason (case-insensitive)")
    p.add_argument(
        "--since", type=when("--since"), help="dead-lettered since: 24h, 30m, 7d, or a local time"
    )
    p.add_argument(
        "--until", type=when("--until"), help="dead-lettered until: 1h, or 2026-11-30 17:05"
    )
    if limit:
        p.add_argument("--limit", type=whole(1), help="at most this many")
        p.add_argument("--offset", type=whole(0), default=0, help="skip this many matches first")


def _dlq(sub: Any) -> None:
    dlq = group(sub, "dlq", "the dead-letter queue")
    _dlq_filters(
        command(
            dlq,
            "list",
            at("dlq", "dlq_list"),
            "dead letters, oldest first: id, when, class, HTTP status, attempts, reason, URL, "
            "then the total per class",
        ),
        limit=True,
    )
    command(
        dlq, "show", at("dlq", "dlq_show"), "one entry in full, as JSON, secrets masked"
    ).add_argument("id")
    _dlq_filters(
        command(dlq, "export", at("dlq", "dlq_export"), "matching entries, one JSON per line"),
        limit=True,
    )
    for name, help_ in (
        ("requeue", "put entries back in the queue, attempts reset (IDs, --all or filters)"),
        (
            "purge",
            "delete entries for good (IDs, --all or filters); with an SQL archive, only "
            "those archived already",
        ),
    ):
        bulk = command(dlq, name, at("dlq", f"dlq_{name}"), help_)
        _dlq_filters(bulk, ids=True, limit=True)
        bulk_options(bulk)
    archive = command(
        dlq,
        "archive",
        at("archive", "dlq_archive"),
        "copy the dead letters not archived yet into the SQL archive (--url, or the "
        "project's HA_DLQ_ARCHIVE_URL); idempotent",
    )
    archive.add_argument("--url", help="SQLAlchemy URL (default: the project's HA_DLQ_ARCHIVE_URL)")
    archive.add_argument(
        "--table",
        help=f"table name (default: the project's HA_DLQ_ARCHIVE_TABLE, else {ARCHIVE_TABLE})",
    )
    archive.add_argument("--dry-run", action="store_true", help="count, copy nothing")


def _checkpoints(sub: Any) -> None:
    cps = group(sub, "checkpoints", "pagination checkpoints")
    command(
        cps,
        "list",
        at("checkpoints", "checkpoints_list"),
        "one line per task: task, its page (or done), items, size in bytes",
    )
    command(
        cps, "show", at("checkpoints", "checkpoints_show"), "one task's checkpoint (JSON)"
    ).add_argument("task")
    reset = command(
        cps,
        "reset",
        at("checkpoints", "checkpoints_reset"),
        "delete checkpoints (TASKs, or --all): those tasks start from their first page again",
    )
    reset.add_argument("tasks", nargs="*", metavar="TASK")
    reset.add_argument("--all", action="store_true", help="every checkpoint of the crawl")
    bulk_options(reset)


def _report(sub: Any) -> None:
    parser = command(
        sub,
        "report",
        at("report", "report"),
        "a crawl's summary over a window (--since 24h): states, done/retried/dead, retry "
        "success rate, dead letters by class, domain and reason, workers seen",
    )
    parser.add_argument(
        "--since",
        type=parse_window,
        default=parse_window(REPORT_WINDOW),
        help=f"window (default {REPORT_WINDOW})",
    )
    parser.add_argument("--format", choices=("text", "json", "markdown"), default="text")


def _servers(sub: Any) -> None:
    metrics = command(
        sub,
        "metrics",
        at("metrics", "serve"),
        "serve Prometheus metrics of every crawl under the prefix",
        spider=False,
    )
    metrics.add_argument("--port", type=PORT, default=METRICS_PORT, help="default: %(default)s")
    metrics.add_argument("--addr", default=LOOPBACK, help="listen address (%(default)s)")
    metrics.add_argument(
        "--timeout",
        type=positive,
        default=METRICS_TIMEOUT,
        help="seconds a Redis call may take before a scrape reports redis_up 0 (%(default)s)",
    )
    metrics.add_argument(
        "--rescan",
        type=positive,
        default=METRICS_RESCAN,
        help="seconds between two scans of the key space for new crawls (%(default)s)",
    )
    dashboard = command(
        sub,
        "dashboard",
        at("dashboard", "dashboard"),
        f"serve the dashboard of every crawl under the prefix (http://{LOOPBACK}:"
        f"{DASHBOARD_PORT}/)",
        spider=False,
    )
    dashboard.set_defaults(spider="")  # no crawl of its own: it shows every crawl
    dashboard.add_argument("--host", default=LOOPBACK, help=f"address to bind ({LOOPBACK})")
    dashboard.add_argument(
        "--port", type=PORT, default=DASHBOARD_PORT, help=f"port to listen on ({DASHBOARD_PORT})"
    )
    dashboard.add_argument(
        "--token",
        help=f"required by every request; needed for a non-loopback --host (default: ${TOKEN_ENV})",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``scrapy-ha`` command line: each subcommand's parser carries its :class:`Target`."""
    parser = argparse.ArgumentParser(
        prog="scrapy-ha",
        description="Look at and operate scrapy-ha crawls from the shell.",
        parents=[CRAWL_OPTIONS],
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _status(sub)
    _crawl_commands(sub)
    _delayed(sub)
    _gates(sub)
    _dlq(sub)
    _checkpoints(sub)
    seen_commands(sub)
    _report(sub)
    items_command(sub)
    _servers(sub)
    return parser


#: Positional lists (``ID...``, ``TASK...``) that may also come after options.
TRAILING_LISTS = ("ids", "tasks", "urls", "domains")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, IDs accepted after options too (``purge books --yes 17 18``:
    argparse alone binds an empty ID list at the first option)."""
    parser = build_parser()
    argv = _glued(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(argv)
    dest = next((d for d in TRAILING_LISTS if isinstance(getattr(args, d, None), list)), None)
    if extra and dest and not any(e.startswith("-") for e in extra):
        setattr(args, dest, [*getattr(args, dest), *extra])
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    for name in ("redis_url", "prefix", "shards"):  # given nowhere on the line
        if not hasattr(args, name):
            setattr(args, name, None)
    return args


#: Options whose value may begin with a minus sign by mistake (``--since -5m``).
TIME_OPTIONS = ("--since", "--until")


def _glued(argv: list[str]) -> list[str]:
    """``--since -5m`` as ``--since=-5m``: argparse takes a value beginning with ``-`` for
    an option and says only "expected one argument"; glued, the option's own check names
    the value and what to write."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] in TIME_OPTIONS and arg[:1] == "-" and arg[1:2].isdigit():
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out
