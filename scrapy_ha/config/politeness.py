"""Crawl-wide per-domain limits: politeness that holds with any number of workers.

Scrapy's ``CONCURRENT_REQUESTS_PER_DOMAIN``, ``DOWNLOAD_DELAY`` and AutoThrottle act in one
process: ten workers hit a site ten times as hard as one. These limits live in Redis and
are kept where requests are leased (``lua/lib/polite.lua``, inside the sync script: no
extra round trip):

- ``HA_DOMAIN_CONCURRENCY``: leases of one domain held at once by all workers together
  (a lease is held from the lease to its end, buffered requests included);
- ``HA_DOMAIN_RATE``: request starts per second per domain for the whole crawl; a leased
  request carries the time it may start, and the worker holds it until then;
- ``HA_DOMAIN_LIMITS``: the same per domain, e.g. ``{"example.com": {"rate": 2,
  "concurrency": 4}}`` (a key left out takes the crawl-wide value).

A domain is the host of the URL, lower case, without port (``www.example.com`` and
``example.com`` are two domains, as they are two download slots in Scrapy). A request of a
limited domain is never handed out from memory before Redis has it: it goes through
Redis and comes back leased, within the limits.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy_ha.config.validate import ConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Self

    from scrapy.settings import BaseSettings

__all__ = ["DomainLimit", "Politeness"]

#: The keys a per-domain entry of ``HA_DOMAIN_LIMITS`` may have.
LIMIT_KEYS = ("rate", "concurrency")
#: The field of the limits hash that applies to every domain without its own entry.
EVERY_DOMAIN = "*"


@dataclass(frozen=True)
class DomainLimit:
    """Requests per second (0: no rate limit) and leases at once (0: no concurrency limit)."""

    rate: float = 0.0
    concurrency: int = 0

    def __bool__(self) -> bool:
        return self.rate > 0 or self.concurrency > 0

    def as_field(self) -> str:
        """The value of the limits hash (``lua/lib/polite.lua`` reads it)."""
        return f"{self.rate!r} {self.concurrency}"


@dataclass(frozen=True)
class Politeness:
    """The limits of the crawl: for every domain, and per domain."""

    default: DomainLimit = DomainLimit()
    domains: Mapping[str, DomainLimit] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        """Read ``HA_DOMAIN_RATE``, ``HA_DOMAIN_CONCURRENCY`` and ``HA_DOMAIN_LIMITS``."""
        default = DomainLimit(
            _rate("HA_DOMAIN_RATE", settings.get("HA_DOMAIN_RATE")),
            _concurrency("HA_DOMAIN_CONCURRENCY", settings.get("HA_DOMAIN_CONCURRENCY")),
        )
        raw = _overrides(settings.get("HA_DOMAIN_LIMITS") or {})
        domains = {_domain(d): _override(d, v, default) for d, v in raw.items()}
        return cls(default, domains)

    def limit_of(self, domain: str) -> DomainLimit:
        """The limits of *domain* (a host name, lower case)."""
        return self.domains.get(domain, self.default)

    def interval(self, domain: str) -> float:
        """Seconds between two starts of *domain*'s requests (0: no rate limit)."""
        rate = self.limit_of(domain).rate
        return 1 / rate if rate > 0 else 0.0

    def limited(self, domain: str) -> bool:
        """Does any crawl-wide limit apply to *domain*?"""
        return bool(self.limit_of(domain))

    def __bool__(self) -> bool:
        return bool(self.default) or any(self.domains.values())

    def as_hash(self) -> dict[str, str]:
        """The limits hash of the crawl (``{}`` when nothing is limited)."""
        if not self:
            return {}
        fields = {EVERY_DOMAIN: self.default.as_field()}
        fields.update({d: lim.as_field() for d, lim in self.domains.items()})
        return fields


def _overrides(raw: Any) -> dict[Any, Any]:
    """``HA_DOMAIN_LIMITS`` as a dict (given on the command line, it is JSON)."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            pass  # refused below, with the expected shape
    if not hasattr(raw, "items"):
        raise ConfigError(
            f"HA_DOMAIN_LIMITS={raw!r} must be a dict of domain -> "
            f'{{"rate": <requests/s>, "concurrency": <n>}}'
        )
    return dict(raw)


def _rate(name: str, value: Any) -> float:
    if value is None:
        return 0.0
    try:
        rate = float(value)
    except (TypeError, ValueError):
        rate = -1.0
    if isinstance(value, bool) or not math.isfinite(rate) or rate < 0:
        raise ConfigError(
            f"{name}={value!r} must be a number of requests per second, 0 or more "
            f"(0 or None: no rate limit)"
        )
    return rate


def _concurrency(name: str, value: Any) -> int:
    if value is None:
        return 0
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    if not ok and isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if not ok:
        raise ConfigError(
            f"{name}={value!r} must be a whole number of requests, 0 or more "
            f"(0 or None: no concurrency limit)"
        )
    return int(value)


def _domain(domain: Any) -> str:
    """A key of ``HA_DOMAIN_LIMITS`` as the scripts read a request's host: lower case, an
    IPv6 address in brackets (``::1`` is ``[::1]``), an IDN in punycode as Scrapy's request
    URLs have it (``bücher.example`` is ``xn--bcher-kva.example``: kept as written, its
    limit never applied)."""
    if isinstance(domain, str) and domain.count(":") > 1:
        address = domain.removeprefix("[").removesuffix("]")
        if address and all(c in "0123456789abcdefABCDEF:." for c in address):
            return f"[{address.lower()}]"
    if not isinstance(domain, str) or not domain or any(c in domain for c in " /:@*[]"):
        raise ConfigError(
            f"HA_DOMAIN_LIMITS has the key {domain!r}: keys must be host names, "
            f'e.g. "example.com" (no scheme, port or path)'
        )
    host = domain.lower()
    try:
        return host if host.isascii() else host.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise ConfigError(
            f"HA_DOMAIN_LIMITS has the key {domain!r}: not a host name (IDNA refuses it)"
        ) from None


def _override(domain: str, value: Any, default: DomainLimit) -> DomainLimit:
    if not hasattr(value, "items") or not set(dict(value)) <= set(LIMIT_KEYS):
        raise ConfigError(
            f"HA_DOMAIN_LIMITS[{domain!r}]={value!r} must be a dict with the keys "
            f'"rate" and/or "concurrency", e.g. {{"rate": 2, "concurrency": 4}}'
        )
    where = f"HA_DOMAIN_LIMITS[{domain!r}]"
    rate = _rate(f"{where}['rate']", value.get("rate", default.rate))
    concurrency = _concurrency(
        f"{where}['concurrency']", value.get("concurrency", default.concurrency)
    )
    return DomainLimit(rate, concurrency)


def limits_in_force(fields: Mapping[Any, Any]) -> dict[str, DomainLimit]:
    """The limits a crawl's limits hash holds (its ``HGETALL``): ``*`` -> every domain's,
    else the domain's own; a field nobody can read is left out (the scripts ignore it too)."""
    found = {}
    for key, value in fields.items():
        name = key.decode() if isinstance(key, bytes) else str(key)
        text = value.decode() if isinstance(value, bytes) else str(value)
        try:
            rate, concurrency = text.split()
            found[name] = DomainLimit(float(rate), int(float(concurrency)))
        except ValueError:
            continue
    return found


def held_slots(state: Mapping[Any, Any]) -> dict[str, int]:
    """Leases holding a concurrency slot per domain, from the polite hash (its ``HGETALL``)."""
    held = {}
    for key, value in state.items():
        name = key.decode() if isinstance(key, bytes) else str(key)
        if name.startswith("n:"):
            try:
                held[name[2:]] = int(value)
            except ValueError:
                continue
    return held


def describe(limits: Mapping[str, DomainLimit], held: Mapping[str, int]) -> str:
    """One line for ``scrapy-ha status``: the limits in force and the slots held now."""

    def one(lim: DomainLimit) -> str:
        parts = [f"rate {lim.rate:g}/s" if lim.rate else "", f"concurrency {lim.concurrency}"]
        return ", ".join(p for p in parts if p and not p.endswith(" 0")) or "none"

    text = "; ".join(
        ("every domain" if d == EVERY_DOMAIN else d) + ": " + one(lim)
        for d, lim in sorted(limits.items(), key=lambda x: (x[0] != EVERY_DOMAIN, x[0]))
        if d != EVERY_DOMAIN or lim
    )
    if held:
        text += " (slots held: " + ", ".join(f"{d} {n}" for d, n in sorted(held.items())) + ")"
    return text
