"""What the dashboard reads from Redis besides its tables (:mod:`._tables`): the crawls
under a prefix, a crawl's numbers and closed gates, and how an action's report reads."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from scrapy_ha.keys import Keys
from scrapy_ha.ops.crawls import SCAN_COUNT, SHARD_COUNT_TAIL, KeyNames, crawls_match, unsharded
from scrapy_ha.ops.stats import CrawlStats, read_crawl_stats_async

if TYPE_CHECKING:
    from scrapy_ha.dashboard._actions import Action, Done

#: Minutes of the rate chart on the overview (the last hour).
CHART_MINUTES = 60


async def crawl_names(client: Any, prefix: str, texts: KeyNames | None = None) -> list[str]:
    """The spiders that have a crawl's keys under *prefix* (:func:`crawls_match`); a key name
    that is not UTF-8 is skipped (*texts*: logged once for all its SCANs)."""
    head = f"{prefix}:{{"
    names: set[str] = set()
    sharded: set[str] = set()  # those with a shard count (``<prefix>:{<spider>}:shards``)
    texts = texts or KeyNames(prefix)
    texts.scan()
    async for key in client.scan_iter(match=crawls_match(prefix), count=SCAN_COUNT):
        text = texts.text(key)
        if text is None:
            continue
        rest = text[len(head) :]
        end = rest.find("}:")
        if end > 0:
            names.add(rest[:end])
            if rest.endswith(SHARD_COUNT_TAIL) and len(rest) == end + len(SHARD_COUNT_TAIL):
                sharded.add(rest[:end])
    texts.log()
    pipe = client.pipeline(transaction=False)
    for crawl in sorted(sharded):
        pipe.get(Keys(prefix, crawl).shard_count)
    layouts = zip(sorted(sharded), await pipe.execute(raise_on_error=False), strict=True)
    return unsharded(names, dict(layouts))  # a sharded crawl's shards are one crawl


async def crawl_stats(client: Any, keys: Keys, *, domains: bool) -> CrawlStats:
    return await read_crawl_stats_async(client, keys, domains=domains)


# -- formatting -------------------------------------------------------------------------


def today_ms(now_ms: int) -> int:
    """Local midnight of the day of *now_ms*."""
    day = datetime.fromtimestamp(now_ms / 1000).astimezone()
    return int(day.replace(hour=0, minute=0, second=0, microsecond=0).timestamp() * 1000)


def body_text(raw: bytes) -> str:
    """A request body as text: as it is when UTF-8, else with its bytes escaped."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return raw.decode("latin-1").encode("unicode_escape").decode()


def report(action: Action, done: Done, selected: int) -> str:
    """What an action did, as the page that ran it says it (and why it left the entries
    it did not touch)."""
    touched = done.touched
    if action.table is None:
        return action.done if touched else f"was {action.done} already"
    if action.table == "gates":  # (of the domains named, those whose gate was closed)
        said = f"{action.done} {touched} of {selected} gate{'' if selected == 1 else 's'}"
    else:
        said = f"{action.done} {touched} of {selected} entr{'y' if selected == 1 else 'ies'}"
    return f"{said}; {done.untouched}" if done.untouched else said
