"""What an operator reads of a stored request, without rebuilding it.

The dead-letter queue lists, shows and requeues requests that may come from another
worker, another spider version or a corrupt entry: it reads the stored document as data
(no class is looked up, no callback bound), and never fails on what it cannot read.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

from scrapy_ha import metakeys
from scrapy_ha.codec.document import (
    BODY,
    BYTES_TAG,
    CALLBACK,
    DICT_TAG,
    ERRBACK,
    META,
    METHOD,
    PRIORITY,
    URL,
)
from scrapy_ha.codec.masking import mask_body, mask_payload

#: Meta keys of past attempts: a request put back by an operator starts with a fresh budget
#: and an empty history (the verdict is stripped on storing already; an old payload has it).
ATTEMPT_META = frozenset((metakeys.RETRIES, metakeys.HISTORY, metakeys.OUTCOME))


@dataclass(frozen=True)
class RequestSummary:
    """A stored request as an operator reads it (see :func:`describe`)."""

    #: The request's URL; ``None`` when the payload is not a readable request.
    url: str | None
    method: str = "GET"
    priority: int = 0
    #: Names of the spider methods it calls back (``None``: Scrapy's default).
    callback: str | None = None
    errback: str | None = None
    body: bytes = b""
    #: The stored document as read (``json.loads`` of the payload; ``{}`` if unreadable).
    document: dict[str, Any] = field(default_factory=dict)

    def printable(self) -> dict[str, Any]:
        """The stored document fit to print: secrets masked, the body left out (print
        :attr:`body` in a form a reader can read)."""
        shown: dict[str, Any] = mask_payload({k: v for k, v in self.document.items() if k != BODY})
        return shown

    @property
    def shown_body(self) -> bytes:
        """The body fit to print: the values of its secret-looking fields masked (a form's
        ``password=...``, a JSON body's ``"token": ...``)."""
        return mask_body(self.body)


def describe(payload: bytes | str | None) -> RequestSummary:
    """The summary of a stored request: URL, method, priority, callbacks, body.

    Never raises: a payload that is not a readable request gives ``url=None``.
    """
    doc = _document(payload)
    url = doc.get(URL)
    return RequestSummary(
        url=url if isinstance(url, str) else None,
        method=_str(doc.get(METHOD)) or "GET",
        priority=_int(doc.get(PRIORITY)),
        callback=_str(doc.get(CALLBACK)),
        errback=_str(doc.get(ERRBACK)),
        body=_body(doc.get(BODY)),
        document=doc,
    )


def reset_attempts(payload: bytes) -> bytes:
    """*payload* without the attempt counters, history and verdict in its meta.

    A payload that cannot be read is returned as it is (it is dead-lettered again as corrupt
    when a worker leases it).
    """
    doc = _document(payload)
    if not doc:
        return payload
    meta = doc.get(META)
    if isinstance(meta, dict) and isinstance(meta.get(DICT_TAG), list):  # non-string keys
        meta[DICT_TAG] = [pair for pair in meta[DICT_TAG] if not _attempt_pair(pair)]
    elif isinstance(meta, dict):
        for key in ATTEMPT_META:
            meta.pop(key, None)
        if not meta:
            del doc[META]
    return json.dumps(doc, separators=(",", ":")).encode()


def _attempt_pair(pair: Any) -> bool:
    return (
        isinstance(pair, list)
        and bool(pair)
        and isinstance(pair[0], str)
        and (pair[0] in ATTEMPT_META)
    )


def _document(payload: bytes | str | None) -> dict[str, Any]:
    try:
        doc = json.loads(payload) if payload else {}
    except (ValueError, RecursionError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int:
    return value if type(value) is int else 0


def _body(stored: Any) -> bytes:
    if isinstance(stored, dict) and isinstance(stored.get(BYTES_TAG), str):
        try:
            return base64.b64decode(stored[BYTES_TAG])
        except (binascii.Error, ValueError):
            return b""
    if isinstance(stored, str):
        return stored.encode("utf-8", "surrogatepass")
    return b""
