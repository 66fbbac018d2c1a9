"""``scrapy-ha seen check SPIDER URL...`` and ``scrapy-ha seen forget SPIDER URL...``: what
the crawl's dupefilter holds of a URL, and letting it go.

A URL is known to the dupefilter by its fingerprint, made as a worker of the spider makes
it (the project's ``REQUEST_FINGERPRINTER_CLASS``; a GET of that URL, as a link followed
is). ``forget`` removes it (:mod:`scrapy_ha.store.forget`): the next page that links to it
gets it crawled again. ``--domain`` and ``--pattern`` forget every URL of a domain, or
matching a pattern, seen until now: the dupefilter holds fingerprints, not URLs, so these
are kept as rules that workers apply (within ``HA_LEASE_RENEW_INTERVAL``).
"""

from __future__ import annotations

import ipaddress
import re
import sys
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from scrapy import Request

from scrapy_ha.cli.common import approve, plural
from scrapy_ha.config.continuous import dupefilter_ttl
from scrapy_ha.config.memory import MemoryConfig
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.keys import FINGERPRINT_BYTES, SEEN_SLICES, shard_of
from scrapy_ha.ops.display import local_time
from scrapy_ha.store.aged import slices_where
from scrapy_ha.store.bloom import BLOOM_FINGERPRINT_BYTES
from scrapy_ha.store.buckets import read_buckets, sized, wire_fingerprint
from scrapy_ha.store.claims import crawl_dupefilter
from scrapy_ha.store.forget import (
    ForgetRules,
    add_rule,
    every_shard,
    forget_fingerprints,
    read_rules,
    seen_where,
)

if TYPE_CHECKING:
    import argparse

    from scrapy_ha.cli.project import WorkerView
    from scrapy_ha.store.queue import RedisQueue


def given(args: argparse.Namespace) -> None:
    """Refuse a URL Scrapy cannot request and a ``--domain`` that is not a host name (a
    rule matches a URL's host name alone: a scheme, a port or a path in it would match
    nothing); take each domain as workers see a host. Exit code 2, as any usage error (1
    is a URL not seen)."""
    for url in args.urls:
        try:
            Request(url)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{url!r} is not a URL a spider could request: {exc}") from None
    if getattr(args, "domain", None):
        args.domain = [host_name(domain) for domain in args.domain]
    for pattern in getattr(args, "pattern", None) or []:
        url_glob(pattern)


def url_glob(pattern: str) -> str:
    """*pattern* if it can match a URL (a rule stays for the crawl's life): not blank, and
    a scheme (``https://shop.example/p/*``) unless a wildcard stands for one (``*/p/*``); a
    QA run: ``--pattern ''`` and ``--pattern notaurl`` were stored as rules matching nothing."""
    literal = re.split(r"[*?\[]", pattern, maxsplit=1)
    if not pattern.strip() or (len(literal) == 1 and not URL_START.match(pattern)):
        raise ConfigError(
            f"--pattern {pattern!r} can match no URL: a pattern matches whole URLs, "
            "* and ? as in the shell (https://shop.example/p/*, or *shop.example/p/*)"
        )
    return pattern


#: How a URL starts: its scheme (``https:``, ``data:``).
URL_START = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


#: A host name as a rule holds it: what ``urlsplit(url).hostname`` gives of a URL a spider
#: requests (lower case, IDNA, no brackets, no trailing dot).
HOST = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*")


def host_name(domain: str) -> str:
    """*domain* as workers see a URL's host (``Bücher.Example.`` -> ``xn--bcher-kva.example``),
    or a ConfigError: a rule matches a URL's host name alone."""
    host = domain.removeprefix("[").removesuffix("]").rstrip(".").lower()
    try:
        if host.count(":") > 1:
            return str(ipaddress.IPv6Address(host))
        host = host.encode("idna").decode("ascii")
    except (ValueError, UnicodeError):
        host = ""
    if not HOST.fullmatch(host):
        raise ConfigError(
            f"--domain {domain!r}: give a host name (shop.example): a rule matches a URL's "
            "host name alone, so a scheme, a port, a path or a wildcard would match nothing"
        )
    return host


def _and_below(host: str) -> str:
    """What a rule of *host* matches beside it: an address has no subdomains."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return " and its subdomains"
    return ""


def fingerprints(
    view: WorkerView, rules: ForgetRules, url: str, size: int = FINGERPRINT_BYTES
) -> tuple[bytes, bytes]:
    """The fingerprint a worker gives a GET of *url* (its first *size* bytes, as a worker
    sends them), and the one the dupefilter knows it by now (another when a forget rule
    matches it)."""
    request = Request(url)  # its URL as a worker has it (an IDN host as IDNA)
    own = sized(view.crawler.request_fingerprinter.fingerprint(request), size)
    return own, rules.fingerprint(own, request.url, urlsplit(request.url).hostname or "")


def _where(found: list[tuple[str, int]], ttl: float) -> str:
    if not found:
        return "not seen"
    kind, start = max(found, key=lambda f: f[1])
    if kind == "set":
        return "seen (kept for ever)"
    where = f"in the time slice started {local_time(start)}"
    if kind == "bloom":
        where += ", or a false positive of its Bloom filter"
    if not ttl:
        return f"seen ({where})"
    new_at = start + int(ttl * 1000 * (1 + 1 / SEEN_SLICES))
    return f"seen ({where}); new again by {local_time(new_at)}"


async def check(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Is each URL seen (the crawl would filter a link to it)? Exit code 0 when every one
    is, 1 when one is not; 2 for a Bloom filter kept for ever, which cannot be read URL by
    URL (in time slices, with ``HA_DUPEFILTER_TTL``, it can: a URL it holds may be a false
    positive)."""
    given(args)
    sliced = await _sliced(queue)
    kept = (
        "a Bloom filter is not read URL by URL when kept for ever (in time slices, with "
        "HA_DUPEFILTER_TTL, it is): nothing to check"
    )
    if not sliced and await _bloom(queue, kept):
        return 2
    view: WorkerView = args.worker_view
    rules = await read_rules(queue.client, queue.keys)
    ttl = await _crawl_ttl(queue, view)
    size = BLOOM_FINGERPRINT_BYTES if sliced else FINGERPRINT_BYTES
    missing = 0
    for url in args.urls:
        own, known = fingerprints(view, rules, url, size)
        if sliced:
            found = await _in_slices(queue, known)
        else:
            found = await seen_where(queue.client, queue.keys, known)
        missing += not found
        note = "" if known == own else " (a forget rule matches it: known by a new fingerprint)"
        print(f"{url}: {_where(found, ttl)}{note}{await _revisited(queue, own)}")
    return 1 if missing else 0


async def _crawl_ttl(queue: RedisQueue, view: WorkerView) -> float:
    """The dupefilter's TTL as the crawl's claim says (this may run outside its project),
    else as the project's ``HA_DUPEFILTER_TTL`` says."""
    settings = view.crawler.settings
    memory = MemoryConfig.from_settings(settings)
    _, ttl = await crawl_dupefilter(queue, memory, dupefilter_ttl(settings))
    return ttl


async def _sliced(queue: RedisQueue) -> bool:
    """Whether the crawl keeps a Bloom filter in time slices (``HA_DUPEFILTER_TTL``): any
    shard's says so (a shard gets its filter with its first URL: shard 0 may have none)."""
    for keys in every_shard(queue.keys):
        if await queue.client.hexists(keys.bloom, "period"):
            return True
    return False


async def _in_slices(queue: RedisQueue, fingerprint: bytes) -> list[tuple[str, int]]:
    """``[("bloom", <start of the newest slice that holds it>)]``, or [] (its shard's)."""
    keys = queue.keys
    if keys.shard is not None:
        keys = keys.of_shard(shard_of(fingerprint, keys.shards))
    (start,) = await slices_where(queue.client, keys, [fingerprint]) or [0]
    return [("bloom", start)] if start else []


async def _revisited(queue: RedisQueue, fingerprint: bytes) -> str:
    """``; revisited (entry N), next visit at T`` for a URL a revisit entry holds; ``; no
    longer revisited: ...`` when that entry was dead-lettered (a page gone for good, at its
    ``HA_REVISIT_MAX_FAILURES``-th failed visit in a row), which leaves the revisits but
    keeps its URL's fingerprint (a requeue gives it back). Before, such a URL was said
    revisited."""
    client, keys = queue.client, queue.keys
    if await read_buckets(client, keys):  # the scripts know it in the buckets' form
        fingerprint = wire_fingerprint(fingerprint)
    entry = await client.hget(keys.revisit_urls, fingerprint)
    if entry is None:
        return ""
    due = await client.zscore(keys.revisits, entry)
    if due is None and await client.hexists(keys.dead_info, entry):
        return (
            f"; no longer revisited: its entry {entry.decode()} is in the dead-letter queue "
            "(`scrapy-ha dlq requeue` revisits it again)"
        )
    when = ""
    if due is not None:  # (one due already: its visit under way, or its turn not come yet)
        seconds, micros = await client.time()
        past = due <= seconds * 1000 + micros // 1000
        when = f", {'due since' if past else 'next visit'} {local_time(int(due))}"
    return f"; revisited (entry {entry.decode()}){when}"


async def forget(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Let URLs be crawled again the next time a page links to them: each URL given, every
    URL of each ``--domain`` (its subdomains too), every URL matching each ``--pattern``
    (``*`` and ``?`` as in the shell), seen until now."""
    given(args)
    if not (args.urls or args.domain or args.pattern):
        print("nothing to forget: give URLs, --domain or --pattern", file=sys.stderr)
        return 2
    if args.urls and await _bloom(queue, FORGET_BLOOM):
        return 2
    view: WorkerView = args.worker_view
    rules = await read_rules(queue.client, queue.keys)
    known = {url: fingerprints(view, rules, url) for url in args.urls}
    items = []
    for url, (_, now_known) in known.items():
        found = await seen_where(queue.client, queue.keys, now_known)
        items.append(f"{url} ({_where(found, 0)})")
    items += [f"every URL of {d}{_and_below(d)}" for d in args.domain]
    items += [f"every URL matching {p}" for p in args.pattern]
    ok = approve(args, "forget", f"{plural(len(items), 'item')} of {queue.keys.spider}", items)
    if not ok:
        return 0 if ok is None else 1
    removed = await forget_fingerprints(
        queue.client, queue.keys, sorted({f for pair in known.values() for f in pair})
    )
    shards = every_shard(queue.keys)
    for domain in args.domain:
        await add_rule(queue.client, shards, domain=domain)
    for pattern in args.pattern:
        await add_rule(queue.client, shards, glob=pattern)
    print(
        f"forgot {plural(len(known), 'URL')} ({removed} fingerprint(s) removed) and added "
        f"{plural(len(args.domain) + len(args.pattern), 'rule')}: workers apply them within "
        "HA_LEASE_RENEW_INTERVAL; a link to a forgotten URL gets it crawled again"
    )
    return 0


#: Why ``seen forget URL`` cannot work with a Bloom filter, and what works instead.
FORGET_BLOOM = (
    "a Bloom filter cannot take a URL out: give it as --pattern (a rule, which forgets "
    "it); with HA_DUPEFILTER_TTL it is new again by itself once its time slice is dropped, "
    "a TTL (to within an eighth of it) after it was seen"
)


async def _bloom(queue: RedisQueue, why: str) -> bool:
    """Whether the crawl's dupefilter is a Bloom filter (``HA_DUPEFILTER = "bloom"``); if so,
    says *why* the command cannot do what it was asked (any shard's: each its own slot)."""
    for keys in every_shard(queue.keys):
        if await queue.client.exists(keys.bloom):
            print(f"{keys.spider} has a Bloom filter for a dupefilter: {why}", file=sys.stderr)
            return True
    return False
