"""The grammar of the commands of continuous crawling (see :mod:`.grammar`): ``seen check``
and ``seen forget``. Like the rest of the grammar it imports neither Scrapy nor redis."""

from __future__ import annotations

__all__ = ["seen_commands"]

from typing import Any

from scrapy_ha.cli.options import at, bulk_options, command, group


def seen_commands(sub: Any) -> None:
    """``seen check SPIDER URL...`` and ``seen forget SPIDER [URL...] [--domain D]
    [--pattern GLOB]``."""
    seen = group(sub, "seen", "what the crawl's dupefilter holds of URLs")
    command(
        seen,
        "check",
        at("seen", "check"),
        "is each URL seen (a link to it filtered)? exit code 1 when one is not",
    ).add_argument("urls", nargs="+", metavar="URL")
    forget = command(
        seen,
        "forget",
        at("seen", "forget"),
        "let URLs be crawled again when linked again: each URL, every URL of a --domain "
        "(its subdomains too), every URL matching a --pattern (* and ?), seen until now",
    )
    forget.add_argument("urls", nargs="*", metavar="URL")
    forget.add_argument("--domain", action="append", default=[], help="forget a domain's URLs")
    forget.add_argument(
        "--pattern", action="append", default=[], help="forget the URLs matching a glob"
    )
    bulk_options(forget)
