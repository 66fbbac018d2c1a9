"""The grammar of ``scrapy-ha items``: its options, checked by argparse (the command itself
is :mod:`scrapy_ha.cli.items`, imported only once the line is parsed)."""

from __future__ import annotations

__all__ = ["ITEM_SINKS", "items_command"]

from typing import Any

from scrapy_ha.cli.options import (
    at,
    command,
    create_option,
    item_actions,
    positive,
    setting_pair,
    whole,
)

#: What ``items --to`` takes.
ITEM_SINKS = "jsonl:PATH, a SQLAlchemy URL (sqlite:///x.db, postgresql+psycopg://...), or pipelines"
#: The SQL item sink's table unless told (``scrapy_ha.sinks.sql.DEFAULT_TABLE``).
ITEMS_TABLE = "scrapy_ha_items"
#: Entries an item consumer reads and commits at once (``scrapy_ha.config.items.DEFAULT_BATCH``).
ITEMS_BATCH = 100
#: Seconds before a consumer takes over another's (``config.items.DEFAULT_CLAIM_IDLE``).
ITEMS_CLAIM_IDLE = 60.0


def items_command(sub: Any) -> None:
    """``scrapy-ha items SPIDER --to SINK ...`` (see :mod:`scrapy_ha.cli.items`)."""
    parser = command(
        sub,
        "items",
        at("items", "items"),
        'store the crawl\'s items (HA_ITEMS = "outbox") exactly once in a sink',
    )
    parser.add_argument("--to", required=True, help=f"the sink: {ITEM_SINKS}")
    parser.add_argument("--table", default=ITEMS_TABLE, help="an SQL sink's table (%(default)s)")
    parser.add_argument(
        "--group", help="the consumer group (default: named after the sink: one per sink)"
    )
    parser.add_argument(
        "--consumer",
        help="this consumer's name in its group (default: host and path for jsonl, else "
        "host:pid); started again under its name it finishes the batch it was killed in",
    )
    parser.add_argument(
        "--batch",
        type=whole(1),
        default=ITEMS_BATCH,
        help="entries per read and per commit (%(default)s)",
    )
    parser.add_argument(
        "--claim-idle",
        type=positive,
        default=ITEMS_CLAIM_IDLE,
        help="seconds an entry left pending by another consumer waits before this one takes "
        "it over (SQL and pipelines sinks; %(default)s)",
    )
    parser.add_argument(
        "--deaths",
        type=whole(0),
        default=0,
        help="set an entry aside once this many consumers died writing it alone (default 0: "
        "never; see reliability.md: a hung write may commit it all the same)",
    )
    parser.add_argument(
        "-s",
        "--set",
        type=setting_pair,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting over the project's (repeat for several), as `scrapy crawl -s` takes "
        "it: for the pipelines of --to pipelines, or HA_START_TIMEOUT (how long the consumer "
        "waits for Redis at start)",
    )
    item_actions(parser)
    parser.add_argument(
        "--exit-idle",
        type=positive,
        metavar="SECONDS",
        help="exit once the crawl has ended (no live worker, nothing left to crawl or a "
        "`scrapy-ha stop`) and the sink has every item, for this many seconds",
    )
    create_option(parser, "consume (a sink started before its crawl's first worker)")
