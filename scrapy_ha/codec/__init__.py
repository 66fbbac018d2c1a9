"""The request codec: Scrapy requests to compact, versioned JSON and back.

The guarantee: **whoever can write to Redis cannot run code.** No pickle, and a payload is
data, never a recipe for code: decoding never imports a module nor calls a function a
payload names. It builds only

- ``scrapy.Request`` and its subclasses, with the attributes the class declares in
  ``attributes`` (what ``Request.replace`` passes too);
- item classes (``scrapy.Item`` subclasses, dataclasses, attrs classes, pydantic models)
  and ``Enum`` members, of classes this worker trusts: classes it stored itself, classes of
  the spider's own package, those listed in ``HA_CODEC_CLASSES``;
- bound methods of the spider as callbacks and errbacks: methods its own code defines, or
  Scrapy's own callbacks, never the spider's machinery (``_set_crawler``, ``start``...).

Anything else is a :class:`CodecError` (the scheduler dead-letters such an entry as
corrupt). A request read back must have a URL scheme of ``HA_ALLOWED_SCHEMES`` (http and
https by default), or it is :class:`Refused`: whoever writes to Redis must not make a
worker read its own files (``file://``), nor fetch ``s3://``/``ftp://``/``data:`` URLs.

Every value Scrapy users put in ``meta`` and ``cb_kwargs`` round-trips with its type:
bytes, tuples, sets, frozensets, dicts with non-string keys, datetimes (naive and aware),
dates, times, timedeltas, Decimals, UUIDs, Enum members, items and nested requests. Plain
JSON values are stored as they are, so a plain request stays small.

Credentials never reach Redis: proxy credentials, and the ``Authorization`` and ``Cookie``
headers that Scrapy's middlewares add again on every download, are dropped before storing;
:func:`mask_url` and :func:`mask_payload` (from :mod:`scrapy_ha.codec.masking`, the one masking
of everything that leaves a worker) hide secrets in what is printed or archived.

Tools that read stored requests without running them (the dead-letter queue, the CLI) use
:func:`describe` and :func:`reset_attempts`, never the stored field names.

The implementation lives in :mod:`scrapy_ha.codec`: ``document`` (the stored document),
``encode``, ``decode``, ``trust`` (classes and callbacks), ``credentials`` (what is never
stored), ``masking`` (what is shown instead of a secret), ``summary`` (reading without
rebuilding), ``compact`` (the document deflated with a crawl's dictionary, as a worker
stores it: readers expand it first, see :mod:`scrapy_ha.store.dictionary`), ``flat`` (a
flat request's document written directly, byte for byte what ``encode`` writes).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from scrapy_ha.codec.document import (
    ALLOWED_SCHEMES_SETTING,
    CODEC_CLASSES_SETTING,
    DEFAULT_ALLOWED_SCHEMES,
    FORMAT_VERSION,
    UNSTORABLE_POLICIES,
    CodecError,
    Refused,
)
from scrapy_ha.codec.masking import mask_url
from scrapy_ha.codec.summary import RequestSummary, describe, mask_payload, reset_attempts

if TYPE_CHECKING:
    from scrapy_ha.codec.credentials import drop_set_again, strip_credentials
    from scrapy_ha.codec.decode import decode_request, refused_scheme
    from scrapy_ha.codec.encode import encode_request
    from scrapy_ha.codec.flat import header_names

#: What builds or reads Scrapy's own objects, imported at its first use: the tools that only
#: read stored requests (the CLI's ``status``, ``dlq``...) start without importing Scrapy,
#: half of a command's start (a worker has imported it long before).
_WITH_SCRAPY = {
    "drop_set_again": "credentials",
    "strip_credentials": "credentials",
    "decode_request": "decode",
    "refused_scheme": "decode",
    "encode_request": "encode",
    "header_names": "flat",
}


def __getattr__(name: str) -> Any:
    module = _WITH_SCRAPY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # read once: the next reads are a plain global
    return value


__all__ = [
    "ALLOWED_SCHEMES_SETTING",
    "CODEC_CLASSES_SETTING",
    "DEFAULT_ALLOWED_SCHEMES",
    "FORMAT_VERSION",
    "UNSTORABLE_POLICIES",
    "CodecError",
    "Refused",
    "RequestSummary",
    "decode_request",
    "describe",
    "drop_set_again",
    "encode_request",
    "header_names",
    "mask_payload",
    "mask_url",
    "refused_scheme",
    "reset_attempts",
    "strip_credentials",
]
