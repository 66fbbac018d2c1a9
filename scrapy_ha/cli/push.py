"""``scrapy-ha push SPIDER URL...`` / ``push SPIDER -``: add requests to a crawl's queue.

Each argument (or stdin line, with ``-``) is a URL or a JSON object: ``{"url", "callback",
"errback", "priority", "meta", "method", "headers", "body", "dont_filter"}``. A request is
admitted as a worker of the spider admits it (:class:`~scrapy_ha.scheduler.admission.Admission`,
under the settings a worker has: :mod:`scrapy_ha.cli.project`): the fingerprint of the
project's ``REQUEST_FINGERPRINTER_CLASS`` (none under ``BaseDupeFilter``), the shard of that
fingerprint, the codec reading the project's settings; and enqueued with the same script
(sync.lua), so the crawl's dupefilter applies: a URL the crawl has seen is filtered, unless
``dont_filter``. Every line is checked before anything is enqueued: a bad line changes
nothing. A URL whose scheme the project's ``HA_ALLOWED_SCHEMES`` does not allow (http and
https by default) is a bad line: workers would dead-letter it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import sys
from typing import TYPE_CHECKING, Any

import redis.exceptions
from scrapy import Request

from scrapy_ha.cli.common import plural
from scrapy_ha.codec import CodecError, refused_scheme
from scrapy_ha.codec.document import CALLBACK, ERRBACK
from scrapy_ha.codec.trust import callback_method
from scrapy_ha.config.continuous import RevisitConfig
from scrapy_ha.config.scheduler import SchedulerConfig
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.scheduler.admission import Admission
from scrapy_ha.store.dictionary import SAMPLES, Compactor, Dictionaries
from scrapy_ha.store.forget import ForgetRules, read_rules
from scrapy_ha.store.scripts import MAX_PRIORITY

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    from scrapy import Spider

    from scrapy_ha.cli.project import WorkerView
    from scrapy_ha.store.queue import RedisQueue
    from scrapy_ha.store.wire import NewEntry

#: Requests per enqueue call: the batch size workers use too.
BATCH = 500
#: An HTTP method: an RFC 9110 token (Scrapy upper-cases it).
_METHOD = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def _is_spider_method(value: Any) -> bool:
    return isinstance(value, str) and value.isidentifier() and not value.startswith("_")


def _is_header_value(value: Any) -> bool:
    if isinstance(value, list):
        return all(isinstance(v, str) for v in value)
    return isinstance(value, str)


#: What a request's own ``meta["ha_revisit"]`` is checked by (the crawl's rules aside).
_NO_RULES = RevisitConfig(rules=())

_SPIDER_METHOD = "the name of a spider method (a plain identifier, not starting with '_')"
#: What each field of a JSON line must be (checked as JSON gives it: no coercion, so that
#: "false" is not taken for true nor 2.9 for 2) and how an error says it.
FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "url": (lambda v: isinstance(v, str), "a string"),
    "callback": (_is_spider_method, _SPIDER_METHOD),
    "errback": (_is_spider_method, _SPIDER_METHOD),
    "priority": (
        lambda v: type(v) is int and -MAX_PRIORITY <= v <= MAX_PRIORITY,
        f"a whole number from -{MAX_PRIORITY} to {MAX_PRIORITY} (the range scrapy-ha stores)",
    ),
    "meta": (lambda v: isinstance(v, dict), "an object"),
    "method": (
        lambda v: isinstance(v, str) and _METHOD.fullmatch(v) is not None,
        "an HTTP method such as GET or POST",
    ),
    "headers": (
        lambda v: isinstance(v, dict) and all(_is_header_value(h) for h in v.values()),
        "an object whose values are strings or arrays of strings",
    ),
    "body": (lambda v: isinstance(v, str), "a string"),
    "dont_filter": (lambda v: isinstance(v, bool), "true or false"),
}
#: Where lines come from, as a span of them is named (``stdin lines 3 to 9``).
_SOURCES = {"stdin line": "stdin lines", "argument": "arguments"}


class BadLine(ValueError):
    """A line that is no request; the message names the line and what to fix."""


def _shown(value: Any) -> str:
    """A JSON value as an error names it: ``the string "false"``, ``the number 2.9``."""
    if value is None:
        return "null (leave the field out for its default)"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = json.dumps(value, ensure_ascii=False)
    text = text if len(text) <= 60 else text[:57] + "..."
    if isinstance(value, str):
        return f"the string {text}"
    if isinstance(value, int | float):
        return f"the number {text}"
    return f"{'an array' if isinstance(value, list) else 'an object'} {text}"


def _checked(doc: dict[str, Any], where: str) -> None:
    unknown = set(doc) - set(FIELDS)
    if unknown:
        raise BadLine(
            f"{where}: unknown field(s) {', '.join(sorted(unknown))}; known: "
            f"{', '.join(sorted(FIELDS))}"
        )
    if "url" not in doc:
        raise BadLine(f'{where}: a JSON request needs a "url" string')
    for field, value in doc.items():
        valid, kind = FIELDS[field]
        if not valid(value):
            raise BadLine(f'{where}: "{field}" must be {kind}, not {_shown(value)}')


def _request(doc: dict[str, Any], where: str) -> Request:
    _checked(doc, where)
    meta = doc.get("meta") or {}
    try:  # a worker would crawl it once, not revisit it, and say so in its log alone
        _NO_RULES.interval_for(doc["url"], meta)
    except ConfigError as exc:
        raise BadLine(f"{where}: {exc}") from None
    try:
        return Request(
            doc["url"],
            method=doc.get("method", "GET"),
            headers=doc.get("headers"),
            body=doc.get("body", "").encode(),
            meta=doc.get("meta"),
            priority=doc.get("priority", 0),
            dont_filter=doc.get("dont_filter", False),
        )
    except (TypeError, ValueError) as exc:  # a URL Scrapy refuses ("Missing scheme")
        raise BadLine(f"{where}: {exc}{_a_file(doc['url'])}") from None


def _a_file(url: object) -> str:
    """How to push a file's lines, when a request given is the name of a file."""
    if isinstance(url, str) and os.path.isfile(url):
        return f" ({url} is a file: to push its lines, give - and the file on stdin: - < {url})"
    return ""


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
    names = {CALLBACK: doc.get("callback"), ERRBACK: doc.get("errback")}
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


def _entries(
    args: argparse.Namespace, view: WorkerView, rules: ForgetRules
) -> list[tuple[NewEntry, str]]:
    """Every line as an entry, with where it came from (``stdin line 3``), fingerprinted
    under the crawl's forget *rules* and for its dupefilter (``args.dupefilter``: the kind
    and TTL its claim names) as a worker does."""
    config = SchedulerConfig.from_settings(view.crawler.settings)
    if dupefilter := getattr(args, "dupefilter", None):
        memory, ttl = dupefilter
        config = dataclasses.replace(config, memory=memory, dupefilter_ttl=ttl)
    admission = Admission.from_config(view.crawler, config)
    admission.set_rules(rules)
    entries = []
    for line, where in _lines(args):
        request, callbacks = parse_line(line, where)
        if not view.caveat:  # the spider's own class: a worker would dead-letter it as corrupt
            for name in callbacks.values():
                try:
                    callback_method(view.spider, name)  # the worker's own test
                except CodecError as exc:
                    raise BadLine(f"{where}: {exc}") from None
        if refusal := refused_scheme(request, admission.schemes):
            raise BadLine(f"{where}: {refusal}; workers fetch no other scheme from Redis")
        try:
            entries.append((new_entry(request, callbacks, admission, view.spider), where))
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
        entries = _entries(args, view, await read_rules(queue.client, queue.keys))
    except BadLine as exc:
        print(f"nothing pushed: {exc}", file=sys.stderr)
        return 1
    added = done = 0
    try:
        if entries and (claim := getattr(args, "claim_kind", None)):
            await claim()  # the crawl's dupefilter kind, before its first write
        await _compact(queue, view, entries)
        for start in range(0, len(entries), BATCH):
            batch = [entry for entry, _ in entries[start : start + BATCH]]
            added += await queue.enqueue(batch)
            done += len(batch)
    except redis.exceptions.RedisError as exc:
        said = f"error: {_stopped(queue, entries, done, added)} Redis failed: {exc}"
        print(f"{said}; {_not_pushed(entries, done)}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C (then "interrupted")
        said = f"interrupted: {_stopped(queue, entries, done, added)} Ctrl-C"
        print(f"{said}; {_not_pushed(entries, done)}", file=sys.stderr)
        raise
    print(
        f"pushed {plural(len(entries), 'request')} to {queue.keys.spider}: {added:,} added, "
        f"{len(entries) - added:,} filtered (seen before)"
    )
    return 0


async def _compact(
    queue: RedisQueue, view: WorkerView, entries: list[tuple[NewEntry, str]]
) -> None:
    """Compact the entries as a worker's requests go pending (``HA_COMPACT_PAYLOADS``):
    with the crawl's dictionary, or one trained from the first of them and published as
    a worker publishes its own when the crawl has none yet. Stored plain, a pushed seed
    list cost three times the memory a worker's requests do (a QA run: 124 bytes a
    95-character URL, against about 40)."""
    config = SchedulerConfig.from_settings(view.crawler.settings)
    compactor = Compactor(enabled=config.memory.compact_payloads)
    if not compactor.enabled or not entries:
        return
    dictionaries = Dictionaries(queue.client, queue.keys)
    compactor.adopt(await dictionaries.load())
    if compactor.dictionary is None:
        # (the samples are those the training takes: a push of 128 large requests, POST
        # bodies, published an empty dictionary, the crawl's for life; a review)
        for entry, _ in entries[: SAMPLES * 8]:
            compactor.sample(entry.payload)
        if len(compactor.samples) < SAMPLES:  # too few to train one: a worker will
            return
        await compactor.settle(dictionaries)
    for entry, _ in entries:
        entry.payload = compactor.pending(entry.payload)


def _stopped(queue: RedisQueue, entries: list[tuple[Any, str]], done: int, added: int) -> str:
    """What a push that Redis or Ctrl-C stopped half-way did: the lines of the batches it
    stored (then "before" what stopped it)."""
    wheres = [where for _, where in entries]
    pushed = f"{_span(wheres[:done])}, " if done else ""
    return (
        f"pushed {done:,} of {plural(len(wheres), 'request')} to {queue.keys.spider} "
        f"({added:,} added, {done - added:,} filtered), {pushed}before"
    )


def _not_pushed(entries: list[tuple[Any, str]], done: int) -> str:
    """The lines of a stopped push it did not store (the batch under way may be stored in
    part: its reply never came)."""
    left = [where for _, where in entries[done:]]
    if not left:  # (a Ctrl-C after the last batch)
        return "every line was pushed"
    return (
        f"{_span(left)} were not pushed, or only in part: push them again (the dupefilter "
        "drops those already in; one with dont_filter would be queued twice)"
    )


def _span(wheres: list[str]) -> str:
    """``stdin lines 1 to 500`` (the lines of one push come from one source, in a row)."""
    first, last = wheres[0], wheres[-1]
    if first == last:
        return first
    kind, _, n = first.rpartition(" ")
    return f"{_SOURCES[kind]} {n} to {last.rpartition(' ')[2]}"
