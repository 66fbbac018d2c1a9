"""Forgetting seen URLs (``scrapy-ha seen forget``): a URL forgotten may be crawled again
the next time a page links to it.

- One URL: its fingerprint leaves the dupefilter (the buckets, or the single set of a crawl
  made before them, or every time slice of ``HA_DUPEFILTER_TTL``), in the shard that holds
  it.
- Every URL of a domain, or every URL matching a pattern: no set can be searched by domain
  (it holds fingerprints, not URLs), so a *rule* is kept instead in ``ha:{S}:forget``: the
  domain or the pattern, and when it was made. A request that matches rules is checked
  against the dupefilter under the fingerprint of (its fingerprint, the newest matching
  rule's time) (:meth:`ForgetRules.fingerprint`): nothing seen before the rule has that
  fingerprint, so the first request for each such URL after the rule is new, and the next
  ones are filtered again. Made again for the same domain, a rule forgets again. A rule
  stays for the life of the crawl (``flush`` deletes it); what was seen before it stays in
  the dupefilter until its time slice ends (``HA_DUPEFILTER_TTL``), or for ever.

Workers read the rules when they join the crawl and again whenever ``v`` (bumped by every
``seen forget``) changes, at each lease renewal (``HA_LEASE_RENEW_INTERVAL``): a forget
takes effect within that, and a worker then also forgets what it remembers itself of the
fingerprints it sent.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy_ha.keys import shard_of
from scrapy_ha.store import scripts
from scrapy_ha.store.aged import set_slice_where
from scrapy_ha.store.buckets import bucket_of, member_of, read_buckets, wire_fingerprint
from scrapy_ha.store.connection import server_ms
from scrapy_ha.store.wire import text as _s

if TYPE_CHECKING:
    from scrapy_ha.keys import Keys

__all__ = [
    "ForgetRules",
    "add_rule",
    "every_shard",
    "forget_fingerprints",
    "read_rules",
    "rules_of",
    "seen_fingerprint",
    "seen_where",
]

#: Fields of ``ha:{S}:forget``: ``d <domain>`` and ``p <glob>`` -> the rule's time (server
#: ms); ``v`` -> the number of forgets so far (workers reread the rules when it changes).
DOMAIN, PATTERN, VERSION = "d ", "p ", "v"


@dataclass(frozen=True)
class ForgetRules:
    """The crawl's forget rules: domains and URL patterns, each with its time (ms)."""

    version: int = 0
    domains: dict[str, int] = field(default_factory=dict)
    patterns: tuple[tuple[re.Pattern[str], int], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.domains or self.patterns)

    def since(self, url: str, host: str) -> int:
        """The time of the newest rule that matches *url* (of host *host*; 0: none)."""
        newest = 0
        labels = host.split(".")
        # the domain and every domain above it; an address (its last part digits: no top
        # level domain is) is no one's subdomain: a rule 0.0.1 does not match 127.0.0.1
        above = 1 if labels[-1].isdigit() or ":" in host else len(labels)
        for i in range(above):
            newest = max(newest, self.domains.get(".".join(labels[i:]), 0))
        for pattern, at in self.patterns:
            if at > newest and pattern.match(url):
                newest = at
        return newest

    def fingerprint(self, fingerprint: bytes, url: str, host: str) -> bytes:
        """The fingerprint the dupefilter knows *url* by (its own, unless a rule matches)."""
        if not self or not fingerprint:
            return fingerprint
        at = self.since(url, host)
        return seen_fingerprint(fingerprint, at) if at else fingerprint


def seen_fingerprint(fingerprint: bytes, since: int) -> bytes:
    """The fingerprint of a URL forgotten by a rule made at *since* (ms): as long as the
    original (the dupefilter keeps its first bytes)."""
    digest = hashlib.sha1(b"forgotten %d " % since + fingerprint).digest()  # noqa: S324
    return digest[: len(fingerprint)]


def glob_pattern(glob: str) -> re.Pattern[str]:
    """A ``--pattern`` (shell-style: ``*``, ``?``, ``[...]``) as a regular expression over
    the whole URL."""
    return re.compile(fnmatch.translate(glob))


async def read_rules(client: Any, keys: Keys) -> ForgetRules:
    """The crawl's rules as stored (shard 0's copy: each shard holds the same)."""
    return rules_of(await client.hgetall(keys.forget))


def rules_of(stored: dict[Any, Any]) -> ForgetRules:
    """:func:`read_rules` of the rules' hash as read (HGETALL)."""
    raw = {_s(k): _s(v) for k, v in stored.items()}
    domains = {k[len(DOMAIN) :]: int(v) for k, v in raw.items() if k.startswith(DOMAIN)}
    patterns = tuple(
        (glob_pattern(k[len(PATTERN) :]), int(v)) for k, v in raw.items() if k.startswith(PATTERN)
    )
    return ForgetRules(int(raw.get(VERSION, 0)), domains, patterns)


async def add_rule(client: Any, all_keys: list[Keys], *, domain: str = "", glob: str = "") -> int:
    """Forget every URL of *domain* (and its subdomains), or matching *glob*, seen until now,
    in every shard; returns the rule's time (the server's, ms)."""
    at = await server_ms(client)
    field_ = DOMAIN + domain.lower() if domain else PATTERN + glob
    for keys in all_keys:
        await client.hset(keys.forget, field_, at)
        await client.hincrby(keys.forget, VERSION, 1)
    return at


async def forget_fingerprints(client: Any, keys: Keys, fingerprints: list[bytes]) -> int:
    """Remove *fingerprints* from the dupefilter of their shards (the set and every time
    slice), and bump the rules' version so that workers forget their own memory of them;
    returns how many sets held one of them."""
    removed = 0
    for fingerprint in fingerprints:
        shard = keys if keys.shard is None else keys.of_shard(shard_of(fingerprint, keys.shards))
        for key in (shard.dupefilter, *shard.aged_slices()):
            removed += int(await client.srem(key, fingerprint))
        wired = wire_fingerprint(fingerprint)
        removed += int(await client.eval(scripts.FORGET_LUA, 2, shard.buckets, shard.queues, wired))
    for shard_keys in every_shard(keys):
        await client.hincrby(shard_keys.forget, VERSION, 1)
    return removed


async def seen_where(client: Any, keys: Keys, fingerprint: bytes) -> list[tuple[str, int]]:
    """Where the dupefilter holds *fingerprint*: ``[("set", 0)]`` for the set kept for ever
    (its buckets, or the single set of a crawl made before them), ``[("slice", <its start,
    ms>)]`` for the newest time slice that holds it within the TTL (one that ended a TTL
    ago holds nothing, though it stays until the crawl's next write drops it)."""
    shard = keys if keys.shard is None else keys.of_shard(shard_of(fingerprint, keys.shards))
    found: list[tuple[str, int]] = []
    buckets = await read_buckets(client, shard)
    if buckets is not None:
        key = buckets.key(shard, bucket_of(fingerprint, buckets.buckets))
        if await client.sismember(key, member_of(fingerprint)):
            found.append(("set", 0))
    elif await client.sismember(shard.dupefilter, fingerprint):
        found.append(("set", 0))
    start = await set_slice_where(client, shard, fingerprint)
    if start:
        found.append(("slice", start))
    return found


def every_shard(keys: Keys) -> list[Keys]:
    """The keys of every shard of the crawl (*keys* itself when it is not sharded)."""
    return [keys] if keys.shard is None else [keys.of_shard(i) for i in range(keys.shards)]
