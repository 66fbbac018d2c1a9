"""What became of one failed attempt: its failure class and the verdict on it.

The retry middlewares and the proxy middleware judge an attempt; the scheduler carries the
verdict out when Scrapy has finished with the request (a delayed retry, or the dead-letter
queue). The verdict travels in ``request.meta["ha_outcome"]`` as a :class:`Verdict`, which
also reads like the mapping the dead-letter queue stores (``verdict["class"]``,
``{**verdict}``), so the stored fields keep their names.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from scrapy_ha import metakeys

if TYPE_CHECKING:
    from typing import Self

__all__ = ["DEAD", "RETRY", "FailureClass", "PermanentError", "Verdict"]

#: The two things a verdict can say: try again later, or give up (the dead-letter queue).
RETRY: Literal["retry"] = "retry"
DEAD: Literal["dead"] = "dead"


class PermanentError(Exception):
    """Raise from a callback for a failure that no retry can fix: dead-lettered at once."""


class FailureClass(enum.StrEnum):
    """Why an attempt failed. The values are the names stored in Redis, stats and logs."""

    NETWORK = "network"  #: timeouts, DNS, refused or reset connections, data loss, tunnels
    SERVER = "server"  #: 5xx, 408
    RATE_LIMITED = "rate_limited"  #: 429, 503 with Retry-After
    BANNED = "banned"  #: 403, or the user's ban check
    PARSE = "parse"  #: an exception from a callback
    PIPELINE = "pipeline"  #: an exception from an item pipeline
    GONE = "gone"  #: 404, 410
    CLIENT = "client"  #: other 4xx
    PERMANENT = "permanent"  #: exception types the user lists
    # Waits, not failures: the request goes back to Redis without spending an attempt.
    NO_PROXY = "no_proxy"  #: no usable proxy
    PROXY_ERROR = "proxy_error"  #: choosing a proxy failed
    PROXY_AUTH = "proxy_auth"  #: the proxy refused its credentials
    # Set by the retry middleware: a 429 to a request already downloading when its domain's
    # gate closed waits for the gate with the domain's other requests, without an attempt.
    GATE = "gate"
    # Set by the scheduler: a child of the page could not be stored.
    UNSTORABLE = "unstorable"


#: The classes of a wait, not a failure: the request goes back to Redis without an attempt,
#: counted as no retry, and shown as waiting for a proxy.
WAIT_CLASSES = (FailureClass.NO_PROXY, FailureClass.PROXY_ERROR, FailureClass.PROXY_AUTH)

#: The classes of a page the site refused for good (404, 410, another 4xx): its answer, not
#: the crawl's failure. Their dead letters are logged at INFO, as Scrapy's HttpErrorMiddleware
#: logs such a response ("Ignoring response"); a 5xx, a ban or a network error given up on is
#: an ERROR, as Scrapy's own "Gave up retrying" is.
SITE_ANSWERS = (FailureClass.GONE, FailureClass.CLIENT)

#: The classes that have a retry budget of their own (``HA_RETRY_POLICIES`` keys).
RETRY_CLASSES = (
    FailureClass.NETWORK,
    FailureClass.SERVER,
    FailureClass.RATE_LIMITED,
    FailureClass.BANNED,
    FailureClass.PARSE,
    FailureClass.PIPELINE,
    FailureClass.GONE,
    FailureClass.CLIENT,
    FailureClass.PERMANENT,
)


@dataclass(frozen=True)
class Verdict(Mapping[str, Any]):
    """The verdict on one attempt. Build it with :meth:`retry` or :meth:`dead`.

    As a mapping it holds the fields the dead-letter queue stores: ``op``, ``class``,
    ``reason`` and, where they apply, ``delay``, ``status``, ``attempts``, ``errback``.
    """

    op: Literal["retry", "dead"]
    failure_class: FailureClass | str  #: a FailureClass, or the name of a class of the user's own
    reason: str
    delay: float | None = None  #: seconds before the retry (a retry only)
    status: int | None = None  #: the HTTP status of the response that failed
    attempts: int | None = None  #: attempts made (a dead verdict only)
    errback: bool = False  #: the spider's errback handled the given-up request

    @classmethod
    def retry(
        cls, failure_class: FailureClass, reason: str, delay: float, status: int | None = None
    ) -> Self:
        """Try again in *delay* seconds."""
        return cls(RETRY, FailureClass(failure_class), reason, delay=delay, status=status)

    @classmethod
    def dead(
        cls,
        failure_class: FailureClass,
        reason: str,
        *,
        status: int | None = None,
        attempts: int | None = None,
    ) -> Self:
        """Give up: the request goes to the dead-letter queue when Scrapy is done with it."""
        return cls(DEAD, FailureClass(failure_class), reason, status=status, attempts=attempts)

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> Self | None:
        """The verdict in ``meta["ha_outcome"]``, None if there is none. The mapping form
        (:meth:`as_dict`, which a middleware of the user's may set) is read as leniently as
        the scheduler always read it: an ``op`` other than ``"retry"`` or ``"dead"`` is no
        verdict (the request is acked), a class of the user's own is kept as its name, a
        missing reason is empty and a missing delay is none; a status or attempts that is
        not a whole number is left out (every reader of a dead letter counts on ints)."""
        value = meta.get(metakeys.OUTCOME)
        if value is None:  # most requests: no verdict
            return None
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping) or value.get("op") not in (RETRY, DEAD):
            return None
        name = str(value.get("class") or "unknown")
        fclass: FailureClass | str
        try:
            fclass = FailureClass(name)
        except ValueError:
            fclass = name  # a class of the user's own, kept by its name
        delay = value.get("delay")
        return cls(
            op=value["op"],
            failure_class=fclass,
            reason=str(value.get("reason", "")),
            delay=float(delay) if isinstance(delay, int | float) else None,
            status=_whole(value.get("status")),
            attempts=_whole(value.get("attempts")),
            errback=bool(value.get("errback", False)),
        )

    @property
    def is_retry(self) -> bool:
        return self.op == RETRY

    def handled_by_errback(self) -> Self:
        """The same verdict, noting that the spider's errback saw the failure."""
        return replace(self, errback=True)

    def as_dict(self) -> dict[str, Any]:
        """The fields the dead-letter queue stores, under their stored names."""
        data: dict[str, Any] = {"op": self.op, "class": str(self.failure_class)}
        data["reason"] = self.reason
        for name in ("delay", "status", "attempts"):
            value = getattr(self, name)
            if value is not None:
                data[name] = value
        if self.errback:
            data["errback"] = True
        return data

    def __getitem__(self, name: str) -> Any:
        return self.as_dict()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.as_dict())

    def __len__(self) -> int:
        return len(self.as_dict())


def _whole(value: Any) -> int | None:
    """*value* if it is an int (not a bool) of 0 .. 2^31 - 1, else None (Redis's cjson reads
    a longer one as infinity, which it cannot write back: the record would lose its
    history)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31
    return value if ok else None
