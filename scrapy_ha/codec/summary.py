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
from scrapy_ha.codec.compact import SAMPLE_MAX_BYTES, dictionary_id
from scrapy_ha.codec.document import (
    BODY,
    BYTES_TAG,
    CALLBACK,
    CLASS,
    DICT_TAG,
    ERRBACK,
    EXTRA,
    FIELDS,
    HEADERS,
    META,
    METHOD,
    PRIORITY,
    REQUEST_TAG,
    URL,
)
from scrapy_ha.codec.masking import (
    MASK,
    mask_body,
    mask_headers,
    mask_text,
    mask_url,
    secret_name,
)

#: Meta keys of past attempts: a request put back by an operator starts with a fresh budget
#: and an empty history (the verdict is stripped on storing already; an old payload has it).
ATTEMPT_META = frozenset(
    (
        metakeys.RETRIES,
        metakeys.HISTORY,
        metakeys.OUTCOME,
        metakeys.GATE_WAITED,
        metakeys.LOGINS_MET,  # login_once's LoginFailed: requeued, the page logs in again
    )
)


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
    #: The id of the dictionary of a compacted request the reader could not expand (its
    #: dictionary gone from the crawl's key, or another under its id).
    frame_of: int | None = None

    def url_or(self, otherwise: str = "?") -> str:
        """The URL, or what a tool shows in its place for a request it could not read: a
        compacted one says so (not its bytes), anything else is *otherwise*."""
        if self.url is not None:
            return self.url
        if self.frame_of is not None:
            return f"(unreadable: compacted with dictionary {self.frame_of}, which the crawl lacks)"
        return otherwise

    def printable(self) -> dict[str, Any]:
        """The stored document fit to print: secrets masked, the body left out (print
        :attr:`body` in a form a reader can read)."""
        shown: dict[str, Any] = mask_payload({k: v for k, v in self.document.items() if k != BODY})
        return shown

    def shown(self) -> dict[str, Any]:
        """The request as an operator reads it, by Scrapy's attribute names (``method``,
        ``url``, ``headers``, ``cookies``, ``meta``, ``cb_kwargs``, ``flags``,
        ``dont_filter``, ``encoding``, ``class``...), secrets masked; only what differs
        from Scrapy's defaults, the body left out (see :attr:`shown_body`) and the history
        of attempts left out of ``meta`` (a tool lists it apart). Values that plain JSON
        cannot hold stay in their stored, tagged form."""
        masked = self.printable()
        shown: dict[str, Any] = {
            "method": self.method,
            "url": masked.get(URL),
            "callback": self.callback,
            "errback": self.errback,
            "priority": self.priority,
        }
        for attr, key, _default in FIELDS:
            if key in masked and attr not in shown and key != BODY:
                shown[attr.removeprefix("_")] = masked[key]
        meta = shown.get("meta")
        if isinstance(meta, dict) and metakeys.HISTORY in meta:
            shown["meta"] = {k: v for k, v in meta.items() if k != metakeys.HISTORY}
        for attr, key in (("headers", HEADERS), ("class", CLASS), ("attributes", EXTRA)):
            if key in masked:
                shown[attr] = masked[key]
        return shown

    @property
    def last_class(self) -> str | None:
        """The failure class of its last attempt (``meta["ha_history"]``), None for a
        request never failed or unreadable."""
        meta = self.document.get(META)
        history = meta.get(metakeys.HISTORY) if isinstance(meta, dict) else None
        last = history[-1] if isinstance(history, list) and history else None
        found = last.get("class") if isinstance(last, dict) else None
        return found if isinstance(found, str) else None

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
        frame_of=dictionary_id(payload) if isinstance(payload, bytes) else None,
    )


def reset_attempts(payload: bytes) -> bytes:
    """*payload* without the attempt counters, history and verdict in its meta, nor the
    count of a revisited URL's failed visits in a row (``ha_revisit_state``'s ``f``): put
    back, it has ``HA_REVISIT_MAX_FAILURES`` visits again, whoever dead-lettered it.

    A payload that cannot be read is returned as it is (it is dead-lettered again as corrupt
    when a worker leases it).
    """
    doc = _document(payload)
    if not doc:
        return payload
    meta = doc.get(META)
    if isinstance(meta, dict) and isinstance(meta.get(DICT_TAG), list):  # non-string keys
        meta[DICT_TAG] = [pair for pair in meta[DICT_TAG] if not _attempt_pair(pair)]
        for pair in meta[DICT_TAG]:
            if isinstance(pair, list) and len(pair) == 2 and pair[0] == metakeys.REVISIT_STATE:
                _reset_failures(pair[1])
    elif isinstance(meta, dict):
        for key in ATTEMPT_META:
            meta.pop(key, None)
        _reset_failures(meta.get(metakeys.REVISIT_STATE))
        if not meta:
            del doc[META]
    return json.dumps(doc, separators=(",", ":")).encode()


def _reset_failures(state: Any) -> None:
    """A revisited URL's state without its failed visits in a row (the rest is its history:
    validators, interval, evidence)."""
    if isinstance(state, dict):
        state.pop(REVISIT_FAILURES, None)


#: The field of ``ha_revisit_state`` that counts a URL's failed visits in a row
#: (:class:`scrapy_ha.config.continuous.RevisitState`).
REVISIT_FAILURES = "f"


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


# -- masked to be shown ------------------------------------------------------------------

#: The stored document's field of ``Request.cookies`` (every value is a secret).
_COOKIES = next(key for attr, key, _ in FIELDS if attr == "cookies")


def mask_payload(doc: Any) -> Any:
    """A copy of a stored request (``json.loads`` of a payload) fit to print or archive.

    In the request and every request nested in it: the URL as :func:`mask_url` masks it,
    the values of secret headers, every cookie value, the values of secret-looking keys of
    ``meta``, ``cb_kwargs`` and a subclass's attributes at any depth (``http_pass``,
    ``api_key``, ``accessToken``...), and the secret fields of the body (as
    :func:`mask_body`) become ``***``. ``http_user`` and ``http_auth_domain`` say who and
    where, not the secret, and stay.
    """
    if isinstance(doc, dict) and REQUEST_TAG not in doc and BYTES_TAG not in doc:
        return _masked_request(doc)
    return _masked_stored(doc)


#: The largest payload masked to see whether it fits ``SAMPLE_MAX_BYTES`` once its secrets
#: are ``***`` (a bearer token of a kilobyte: 1.3 KB stored, 0.3 KB masked). Masking takes
#: the reactor thread about 0.3 s a MB of meta (its regular expressions): every request a
#: worker admits before the crawl has a dictionary is offered (up to 512 of them), so a
#: crawl whose first requests carried 1 MB of meta each held it 57 s for 300 (a QA run).
SAMPLE_MASK_MAX_BYTES = 8 * SAMPLE_MAX_BYTES


def training_sample(payload: bytes) -> bytes:
    """*payload* (a stored document) fit to train the crawl's compaction dictionary: as it
    is, or masked as :func:`mask_payload` shows it when it holds a secret the request keeps
    (an ``Authorization`` header the spider set, an API key in its URL, a form's password),
    or ``b""`` (no sample) when it is no JSON or larger than the training takes
    (``SAMPLE_MAX_BYTES``). The dictionary is stored in Redis for the whole crawl, past its
    finish, where no request needs the secret; masked, the sample still holds what compacts
    a request: the URL's prefix, its parameters' names, the fields. One larger than
    ``SAMPLE_MASK_MAX_BYTES`` is no sample, unread: masking costs about 0.3 s a MB."""
    if len(payload) > SAMPLE_MASK_MAX_BYTES:
        return b""
    try:
        doc = json.loads(payload)
        shown = mask_payload(doc)
        masked = json.dumps(shown, separators=(",", ":"))
    except (ValueError, TypeError, RecursionError):
        return b""
    if MASK not in masked:
        return payload if len(payload) <= SAMPLE_MAX_BYTES else b""
    if isinstance(shown, dict) and isinstance(shown.get(HEADERS), dict):
        shown[HEADERS] = _tagged_headers(shown[HEADERS])  # as stored: what compacts them
        masked = json.dumps(shown, separators=(",", ":"))
    sample = masked.encode("utf-8", "surrogatepass")
    return sample if len(sample) <= SAMPLE_MAX_BYTES else b""


def _tagged_headers(headers: dict[str, Any]) -> dict[str, Any]:
    """Headers shown as text (:func:`mask_headers`) in the form the codec stores them:
    name and value pairs of tagged bytes."""
    pairs = []
    for name, values in headers.items():
        listed = values if isinstance(values, list) else [values]
        pairs.append([_tagged(name), [_tagged(v) for v in listed]])
    return {DICT_TAG: pairs}


def _tagged(text: Any) -> Any:
    """Text as the codec stores bytes (tagged base64 of its Latin-1 bytes)."""
    try:
        return {BYTES_TAG: base64.b64encode(str(text).encode("latin-1")).decode()}
    except UnicodeEncodeError:
        return text


def _masked_request(doc: dict[str, Any]) -> dict[str, Any]:
    shown: dict[str, Any] = {}
    for key, value in doc.items():
        if key == URL and isinstance(value, str):
            shown[key] = mask_url(value)
        elif key == HEADERS:
            shown[key] = _masked_stored_headers(value)
        elif key == _COOKIES:
            shown[key] = {k: MASK for k in value} if isinstance(value, dict) else MASK
        elif key == BODY:
            shown[key] = _masked_stored_body(value)
        elif key == META or isinstance(value, (dict, list)):
            shown[key] = _masked_stored(value)
        else:
            shown[key] = mask_text(value) if isinstance(value, str) else value
    return shown


def _masked_stored(value: Any) -> Any:
    """A stored (tagged) value: nested requests masked as requests, tagged pairs by key."""
    if isinstance(value, list):
        return [_masked_stored(v) for v in value]
    if isinstance(value, str):
        return mask_text(value)
    if not isinstance(value, dict):
        return value
    if isinstance(value.get(REQUEST_TAG), dict):
        return {**value, REQUEST_TAG: _masked_request(value[REQUEST_TAG])}
    if BYTES_TAG in value:
        return value
    if isinstance(value.get(DICT_TAG), list):
        return {DICT_TAG: [_masked_stored_pair(p) for p in value[DICT_TAG]]}
    return {
        k: MASK if isinstance(k, str) and secret_name(k) else _masked_stored(v)
        for k, v in value.items()
    }


def _masked_stored_pair(pair: Any) -> Any:
    if isinstance(pair, list) and len(pair) == 2:
        name = _stored_text(pair[0])
        return [pair[0], MASK if name and secret_name(name) else _masked_stored(pair[1])]
    return _masked_stored(pair)


def _masked_stored_headers(headers: Any) -> Any:
    """Headers as stored (a dict, or pairs under the dict tag when names are bytes) with
    secret values masked and values shown as text; a form this does not know is masked."""
    if isinstance(headers, dict) and isinstance(headers.get(DICT_TAG), list):
        pairs = headers[DICT_TAG]
        if all(isinstance(p, list) and len(p) == 2 for p in pairs):
            return mask_headers({_stored_text(k) or "?": _stored_values(v) for k, v in pairs})
    elif isinstance(headers, dict):
        return mask_headers({k: _stored_values(v) for k, v in headers.items()})
    return MASK


def _masked_stored_body(body: Any) -> Any:
    """The stored body (text, or tagged bytes) with its secret fields masked, in its form."""
    if isinstance(body, str):
        return mask_body(body.encode("utf-8", "surrogatepass")).decode("utf-8", "surrogatepass")
    if isinstance(body, dict) and isinstance(body.get(BYTES_TAG), str):
        try:
            raw = base64.b64decode(body[BYTES_TAG])
        except (binascii.Error, ValueError):
            return MASK
        return {BYTES_TAG: base64.b64encode(mask_body(raw)).decode()}
    return MASK if body else body


def _stored_text(value: Any) -> str:
    """A stored string, or tagged bytes read as Latin-1 (``""`` for anything else)."""
    if isinstance(value, dict) and isinstance(value.get(BYTES_TAG), str):
        try:
            return base64.b64decode(value[BYTES_TAG]).decode("latin-1")
        except (binascii.Error, ValueError):
            return ""
    return value if isinstance(value, str) else ""


def _stored_values(values: Any) -> Any:
    """Header values as text where they are tagged bytes."""
    if isinstance(values, list):
        return [_stored_text(v) or v for v in values]
    return _stored_text(values) or values
