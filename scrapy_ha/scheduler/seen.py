"""What a worker remembers of the fingerprints it sent, and how long ago a request may have
been seen and still be a duplicate.

Redis's dupefilter is the crawl's (``lua/lib/aged.lua``); a worker also remembers the
fingerprints it sent, so that obvious duplicates are dropped without a round trip. With an
age (``HA_DUPEFILTER_TTL``, or a request's ``meta["ha_recrawl_after"]``) it remembers when,
and a fingerprint it sent longer ago than the request's age goes to Redis, which decides.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from scrapy_ha import metakeys
from scrapy_ha.keys import SEEN_SLICES

if TYPE_CHECKING:
    from scrapy import Request

logger = logging.getLogger(__name__)

__all__ = ["LOCAL_SEEN_LIMIT", "LocalSeen"]

#: Fingerprints remembered locally to drop obvious duplicates without a round trip.
LOCAL_SEEN_LIMIT = 100_000
#: The time remembered for a fingerprint without a TTL (never read).
_NO_TIME = 0.0


class LocalSeen:
    """The fingerprints this worker sent, and when (``time.monotonic()``)."""

    def __init__(self, ttl: float = 0.0) -> None:
        #: HA_DUPEFILTER_TTL in seconds (0: a fingerprint is seen for ever)
        self.ttl = ttl
        self._at: dict[bytes, float] = {}
        self._warned: set[str] = set()
        #: the clock of the times remembered (a test's may run ahead)
        self.clock = time.monotonic

    def __contains__(self, fingerprint: object) -> bool:
        return fingerprint in self._at

    def __len__(self) -> int:
        return len(self._at)

    def seen(self, fingerprint: bytes, age: float | None) -> bool:
        """Did this worker send *fingerprint* less than *age* seconds ago (the TTL when
        *age* is None; ever, without a TTL)?"""
        at = self._at.get(fingerprint)
        if at is None:
            return False
        if not self.ttl:
            return True
        return self.clock() - at < min(self.ttl, self.ttl if age is None else age)

    def remember(self, fingerprint: bytes) -> None:
        if fingerprint:
            if len(self._at) >= LOCAL_SEEN_LIMIT:
                self._at.clear()
            # without a TTL the time is never read: no clock call, and one float for all
            self._at[fingerprint] = self.clock() if self.ttl else _NO_TIME

    def forget(self, fingerprints: list[bytes]) -> None:
        for fingerprint in fingerprints:
            self._at.pop(fingerprint, None)

    def doubt(self, fingerprints: list[bytes]) -> None:
        """*fingerprints* (remembered, with a TTL) may have been seen in Redis long before
        this worker sent them: Redis filtered some of a batch, not saying which. Each is
        kept as seen a slice of the TTL from now (TTL / SEEN_SLICES), not a whole TTL:
        one Redis takes as new again is sent again at most that late, as late as Redis's own
        slices of that length may take it, and a link met on every page still goes to
        Redis once a slice rather than every time (forgotten at once, a crawl of 400 pages
        sharing 20 links sent Redis 66 % more)."""
        back = self.clock() - self.ttl + self.ttl / SEEN_SLICES
        at = self._at
        for fingerprint in fingerprints:
            if fingerprint in at:  # (one sent earlier keeps its own, earlier time)
                at[fingerprint] = min(at[fingerprint], back)

    def clear(self) -> None:
        self._at.clear()

    def age(self, request: Request) -> float | None:
        """The request's ``meta["ha_recrawl_after"]`` in seconds (None: unset, or unusable:
        a WARNING once per reason)."""
        value = request.meta.get(metakeys.RECRAWL_AFTER)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            key = metakeys.RECRAWL_AFTER
            self._warn("bad", f"meta[{key!r}]={value!r} of {request} must be seconds, 0 or more")
            return None
        if not self.ttl:
            self._warn(
                "ttl",
                f"meta[{metakeys.RECRAWL_AFTER!r}] of {request}: without "
                "HA_DUPEFILTER_TTL the dupefilter keeps no time (set it to the longest age a "
                "request asks)",
            )
            return None
        return float(value)

    def _warn(self, reason: str, message: str) -> None:
        if reason not in self._warned:
            self._warned.add(reason)
            logger.warning("%s: ignored (said once)", message)
