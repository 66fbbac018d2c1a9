"""The reason a failed download is stored with: the exception's type and its message, on one
line, bounded and masked.

Before, a ``network`` failure kept the type alone (``scrapy.exceptions.DownloadFailedError``):
a TLS handshake refused, a DNS name that does not exist and a connection the peer reset all
read the same, and Playwright's ``Error`` lost its ``net::ERR_NAME_NOT_RESOLVED at ...``. The
message is what tells an operator why, so the dead letter, the attempt history, ``scrapy-ha
dlq list`` and the SQL archive keep it: ``scrapy.exceptions.CannotResolveHostError: DNS
lookup failed: no results for hostname lookup: nohost.invalid.``. The request's own URL in
the message reads ``<url>`` (``Getting <url> took longer than 180.0 seconds.``): the entry
has it, a long one would crowd out the words after it, and ``scrapy-ha report`` counts
the timeouts of a thousand pages as one reason, not a thousand.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urldefrag

from scrapy.utils.python import global_object_name

from scrapy_ha.codec.masking import mask_text

__all__ = ["MESSAGE_LIMIT", "OWN_URL", "exception_reason"]

#: Characters of an exception's message kept in a reason: a resolver's, a socket's or
#: OpenSSL's words and a host or a URL they name fit; a page of HTML some library put in
#: its message does not. The whole reason stays within
#: ``REASON_LIMIT`` (300) with the type and a proxy's name.
MESSAGE_LIMIT = 200
#: Marks a message cut at MESSAGE_LIMIT.
CUT = "…"
#: What the request's own URL reads as in its reason.
OWN_URL = "<url>"


def exception_reason(exception: BaseException, url: str = "") -> str:
    """``module.Type: message`` of *exception*, or its type alone when it says nothing;
    *url* (the request's, with or without its fragment) reads :data:`OWN_URL` in it.

    The message is masked before it is cut (a cut could leave half a secret that the mask
    no longer recognises), its whitespace runs (newlines of a multi-line message) are one
    space, and it is at most :data:`MESSAGE_LIMIT` characters, :data:`CUT` ending one cut.
    Twisted's wrapped failures (``ResponseNeverReceived``, ``ResponseFailed``: what
    Scrapy's ``DownloadFailedError`` carries as its cause) are named by what they wrap
    (``OpenSSL.SSL.Error: [('SSL routines', '', 'wrong version number')]``), not by the
    ``[<twisted.python.failure.Failure ...>]`` of their text."""
    name = global_object_name(type(exception))
    message = _message(exception, url)
    return f"{name}: {message}" if message else name


def _message(exception: BaseException, url: str) -> str:
    text = _wrapped(exception) or _wrapped(exception.__cause__) or _text(exception)
    for own in {url, urldefrag(url)[0]} - {""}:  # (Scrapy's timeout names it unfragmented)
        text = text.replace(own, OWN_URL)
    text = " ".join(mask_text(text).split())
    if len(text) <= MESSAGE_LIMIT:
        return text
    return text[: MESSAGE_LIMIT - len(CUT)].rstrip() + CUT


def _wrapped(exception: BaseException | None) -> str:
    """What a Twisted ``_WrapperException`` wraps, ``type: text`` each, joined by ``; ``
    (empty for any other exception)."""
    reasons: Any = getattr(exception, "reasons", None)
    if not isinstance(reasons, list) or not reasons:
        return ""
    parts = []
    for failure in reasons:
        value = getattr(failure, "value", None)
        if not isinstance(value, BaseException):
            return ""  # not Twisted's failures: its own text says it
        text = _text(value)
        name = global_object_name(type(value))
        parts.append(f"{name}: {text}" if text else name)
    return "; ".join(parts)


def _text(exception: BaseException) -> str:
    try:
        return str(exception).strip()
    except Exception:  # noqa: BLE001 - an exception whose text raises: its type says enough
        return ""
