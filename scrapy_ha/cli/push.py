"""``scrapy-ha push SPIDER URL...`` / ``push SPIDER -``: add requests to a crawl's queue.

Each argument (or stdin line, with ``-``) is a URL or a JSON object: ``{"url", "callback",
"errback", "priority", "meta", "method", "headers", "body", "dont_filter"}``. A request is
admitted as a worker of the spider admits it (:class:`~scrapy_ha.scheduler.admission.Admission`,
under the settings a worker has: :mod:`scrapy_ha.cli.project`): the fingerprint of the
project's ``REQUEST_FINGERPRINTER_CLASS`` (none under ``BaseDupeFilter``), the shard of that
fingerprint, the codec reading the project's settings; and enqueued with the same script
(sync.lua), so the crawl's dupefilter applies: a URL the crawl has seen is filtered, unless
``dont_filter``. Every line is checked before anything is enqueued: a bad line changes
nothing.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from scrapy import Request

from scrapy_ha.cli.common import command, plural
from scrapy_ha.codec import CodecError
from scrapy_ha.codec.document import CALLBACK, ERRBACK
from scrapy_ha.config.scheduler import SchedulerConfig
from scrapy_ha.scheduler.admission import Admission

if TYPE_CHECKING:
    import argparse

    from scrapy import Spider

    from scrapy_ha.cli.project import WorkerView
    from scrapy_ha.store.queue import RedisQueue
    from scrapy_ha.store.wire import NewEntry

#: Requests per enqueue call: the batch size workers use too.
BATCH = 500
#: The fields a JSON line may have.
FIELDS = frozenset(
    ("url", "callback", "errback", "priority", "meta", "method", "headers", "body", "dont_filter")
)


class BadLine(ValueError):
    """A line that is no request; the message names the line and what to fix."""


def _callback(doc: dict[str, Any], field: str, where: str) -> str | None:
    name = doc.get(field)
    if name is None:
        return None
    if not (isinstance(name, str) and name.isidentifier() and not name.startswith("_")):
        raise BadLine(
            f"{where}: {field}={name!r} must be the name of a spider method (a plain "
            f"identifier, not starting with '_')"
        )
    return name


def _request(doc: dict[str, Any], where: str) -> Request:
    unknown = set(doc) - FIELDS
    if unknown:
        raise BadLine(
            f"{where}: unknown field(s) {', '.join(sorted(unknown))}; known: "
            f"{', '.join(sorted(FIELDS))}"
        )
    if not isinstance(doc.get("url"), str):
        raise BadLine(f'{where}: a JSON request needs a "url" string')
    body = doc.get("body", b"")
    try:
        return Request(
            doc["url"],
            method=str(doc.get("method", "GET")),
            headers=doc.get("headers"),
            body=body.encode() if isinstance(body, str) else body,
            meta=doc.get("meta"),
            priority=int(doc.get("priority", 0)),
            dont_filter=bool(doc.get("dont_filter", False)),
        )
    except (TypeError, ValueError) as exc:
        raise BadLine(f"{where}: {exc}") from None


def parse_line(line: str, where: str) -> tuple[Request, dict[str, str]]:
    """A URL or a JSON request -> (the request, its callback names by document key)."""
    text = line.strip()
    if not text.startswith("{"):
        return _request({"url": text}, where), {}
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise BadLine(f"{where}: not JSON ({exc})") from None
    request = _request(doc, where)
    names = {CALLBACK: _callback(doc, "callback", where), ERRBACK: _callback(doc, "errback", where)}
    return request, {key: name for key, name in names.items() if name}


def new_entry(
    request: Request, callbacks: dict[str, str], admission: Admission, spider: Spider
) -> NewEntry:
    """The request as a worker enqueues it: its payload, its dupefilter fingerprint (none
    for ``dont_filter``), its priority and place; callbacks stored by name."""
    payload = admission.payload(request, spider)
    if callbacks:
        doc = json.loads(payload)
        doc.update(callbacks)
        payload = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    return admission.entry(request, admission.fingerprint(request), payload)


def _lines(args: argparse.Namespace) -> list[tuple[str, str]]:
    if args.requests == ["-"]:
        return [(line, f"stdin line {n}") for n, line in enumerate(sys.stdin, 1) if line.strip()]
    return [(text, f"argument {n}") for n, text in enumerate(args.requests, 1)]


def _entries(args: argparse.Namespace, view: WorkerView) -> list[NewEntry]:
    config = SchedulerConfig.from_settings(view.crawler.settings)
    admission = Admission.from_config(view.crawler, config)
    entries = []
    for line, where in _lines(args):
        request, callbacks = parse_line(line, where)
        try:
            entries.append(new_entry(request, callbacks, admission, view.spider))
        except CodecError as exc:
            raise BadLine(f"{where}: {exc}") from None
    return entries


async def push(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Add requests: URLs or JSON lines (url, callback, errback, priority, meta, method,
    headers, body, dont_filter) as arguments, or from stdin with ``-``; the crawl's
    dupefilter applies. Says how many were added and how many filtered."""
    view: WorkerView = args.worker_view
    if view.caveat:
        print(f"note: {view.caveat}", file=sys.stderr)
    try:
        entries = _entries(args, view)
    except BadLine as exc:
        print(f"nothing pushed: {exc}", file=sys.stderr)
        return 1
    added = 0
    for start in range(0, len(entries), BATCH):
        added += await queue.enqueue(entries[start : start + BATCH])
    print(
        f"pushed {plural(len(entries), 'request')} to {queue.keys.spider}: {added} added, "
        f"{len(entries) - added} filtered (seen before)"
    )
    return 0


def register(sub: Any) -> None:
    """``push SPIDER (URL|JSON)... | push SPIDER -``."""
    command(sub, "push", push).add_argument(
        "requests", nargs="+", metavar="REQUEST", help="a URL or a JSON object; - reads stdin"
    )
