"""The dashboard's actions as its pages and its API take them: which entries an action
takes (the ids named, or all that match a filter), its confirmation, and its report.

A form action is confirmed on a page of its own, which says how many entries it would
touch and carries their ids: the confirmed action takes those ids, never a filter matched
again (what arrived since was not confirmed), as ``scrapy-ha dlq`` acts on the ids it
listed. The JSON API acts at once (``dry_run`` counts first).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from fastapi import HTTPException

from scrapy_ha.dashboard import _guard
from scrapy_ha.dashboard._actions import ACTIONS, Action, Done
from scrapy_ha.dashboard._data import report
from scrapy_ha.dashboard._pages import render
from scrapy_ha.dashboard._tables import ID_BATCH, route, table_key
from scrapy_ha.dashboard._views import crawl_keys, filter_from, known_crawl, tables_of, urls_of
from scrapy_ha.ops.operations import cleared_crawl_note
from scrapy_ha.ops.unreadable import check_types
from scrapy_ha.store.sharding import make_queue

if TYPE_CHECKING:
    from fastapi import Request
    from fastapi.responses import HTMLResponse

    from scrapy_ha.dashboard._tables import Filter

logger = logging.getLogger(__name__)

#: The "table" of the action that opens gates: domains of the crawl page, no rows to read.
GATES = "gates"
#: Entries a confirmation page names by URL before it only counts the rest (a screenful).
CONFIRM_LISTED = 20
#: The largest field of an action's form: a confirmation carries the ids it listed in one
#: field (Starlette's default, 1 MB, holds some 100,000 ids of 10 bytes; this, 3 million).
SELECTION_BYTES = 32 * 1024 * 1024


def action_named(name: str) -> Action:
    if name not in ACTIONS:
        raise HTTPException(404, f"no action {name!r}: one of {', '.join(sorted(ACTIONS))}")
    return ACTIONS[name]


async def _selection(
    request: Request, spider: str, action: Action, ids: list[str], flt: Filter | None
) -> list[str]:
    """The entries *action* takes: the ids given, else every one matching *flt*."""
    if action.table is None:
        return []
    if ids:
        return ids
    if action.table == GATES:
        raise HTTPException(400, 'name the domains to open: {"ids": ["shop.example"]}')
    if flt is None:
        raise HTTPException(400, "name entry ids, or a filter (scope=filter) for all that match")
    return await (await tables_of(request, spider)).all_ids(action.table, flt)


async def _perform(
    request: Request, spider: str, action: Action, ids: list[str]
) -> tuple[Done, str]:
    """Run *action* once every key of the crawl has the type scrapy-ha writes (else a 409
    and nothing done), and log what it did, or that it failed part way. Returns what it
    did, and what to add to its report (a requeue into a crawl its end cleared says what
    the next worker crawls, as ``dlq requeue`` does)."""
    client = request.app.state.client
    await check_types(client, request.app.state.prefix, spider)
    keys = await crawl_keys(request, spider)
    queue = make_queue(client, keys.prefix, spider, keys.shards, span=keys.span)
    done: Done | None = None
    request.state.acting = action.name  # (a Redis that stops answering now: see app.py)
    try:
        done = await action.run(queue, ids)
    finally:
        _audit(spider, action, None if done is None else done.touched, len(ids))
    requeued = action.name == "requeue" and done.touched
    return done, (await cleared_crawl_note(queue) if requeued else "")


def _audit(spider: str, action: Action, touched: int | None, selected: int) -> None:
    """The log line of an action: how many entries it touched, or (None) that it failed
    part way, having perhaps touched some (the crawl's tables say which)."""
    if touched is None:
        logger.warning(
            "dashboard: %s failed part way, some of %d may be %s (%s)",
            action.name,
            selected,
            action.done,
            spider,
        )
        return
    if action.table is None:  # the crawl itself: no entries to count ("paused 1 of 0")
        logger.info("dashboard: %s %s%s", action.done, spider, "" if touched else " (already)")
        return
    logger.info(
        "dashboard: %s %d of %d (%s, %s)", action.done, touched, selected, spider, action.name
    )


async def api_action(request: Request, spider: str, name: str) -> dict[str, Any]:
    """``POST /api/crawls/SPIDER/actions/NAME``: run it at once (or count, ``dry_run``)."""
    action = action_named(name)
    await known_crawl(request, spider)
    body = _json_object(await request.body())
    ids = _ids_of(body)
    flt = await filter_from(request, body["filter"]) if body.get("filter") is not None else None
    selected = await _selection(request, spider, action, ids, flt)
    if body.get("dry_run"):
        found = await _held(request, spider, action, selected) if ids else selected
        return {
            "action": name,
            "dry_run": True,
            "selected": len(found),
            "missing": len(set(selected)) - len(found),
            "touched": 0,
        }
    done, note = await _perform(request, spider, action, selected)
    return {
        "action": name,
        "selected": len(selected),
        "touched": done.touched,
        "report": report(action, done, len(selected)),
        "note": note or None,
    }


async def _held(request: Request, spider: str, action: Action, ids: list[str]) -> list[str]:
    """The distinct *ids* that *action*'s table holds: those it would touch (a dry run
    counted every id given, those the crawl never had too). Gates: the domains as given."""
    ids = list(dict.fromkeys(ids))
    if action.table in (None, GATES):
        return ids
    parts = (await tables_of(request, spider)).parts
    routed = [(i, route(i) if len(parts) > 1 else (0, i)) for i in ids]
    found: list[str] = []
    for shard, part in enumerate(parts):
        mine = [(i, local) for i, (at, local) in routed if at == shard]
        key = table_key(part.keys, action.table)
        for lo in range(0, len(mine), ID_BATCH):
            chunk = mine[lo : lo + ID_BATCH]
            scores = await part.client.zmscore(key, [local for _, local in chunk])
            found += [i for (i, _), score in zip(chunk, scores, strict=True) if score is not None]
    return found


def _json_object(raw: bytes) -> dict[str, Any]:
    """The body of an action's POST: a JSON object, else a 400 that says what to send."""
    try:
        body = json.loads(raw or b"{}")
    except (ValueError, RecursionError):  # (arrays nested 100,000 deep)
        raise HTTPException(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise HTTPException(400, 'the body is a JSON object: {"ids": [...]} or {"filter": {...}}')
    if unknown := sorted(set(body) - BODY_FIELDS):  # (a QA run: {"x": 1} paused the crawl;
        # a typo, {"id": [...]}, is not an action on no entry)
        raise HTTPException(400, f"the body has no field {unknown[0]!r}: {sorted(BODY_FIELDS)}")
    flt = body.get("filter")
    if flt is not None and not isinstance(flt, dict):
        raise HTTPException(400, '"filter" is an object: {"class": "gone", "domain": ...}')
    if flt and (unknown := sorted(set(flt) - FILTER_FIELDS)):
        # an unknown field is not a filter that matches everything: refused
        raise HTTPException(400, f'"filter" has no field {unknown[0]!r}: {sorted(FILTER_FIELDS)}')
    if flt and any(not isinstance(v, str) or not v.strip() for v in flt.values()):
        # an empty value ("class": "" from a script's unset variable) matched everything
        raise HTTPException(
            400, '"filter" values are strings, not empty: {"status": "503"} (leave a field out)'
        )
    if flt == {} and body.get("all") is not True:
        raise HTTPException(400, '{"filter": {}} takes every entry: add "all": true to mean it')
    for name in ("dry_run", "all"):
        if not isinstance(body.get(name, False), bool):
            raise HTTPException(400, f'"{name}" is true or false')
    return body


#: The fields of an action's body.
BODY_FIELDS = frozenset({"ids", "filter", "all", "dry_run"})
#: The fields of an action's "filter" (``filter_from``).
FILTER_FIELDS = frozenset({"class", "domain", "status", "since", "until"})


def _ids_of(body: dict[str, Any]) -> list[str]:
    """The ``ids`` of an action's body: a list of strings (a string is refused, not read
    as its characters; a number is refused, not taken for an id of another form)."""
    ids = body.get("ids")
    if ids is None:
        return []
    if not isinstance(ids, list) or not all(isinstance(i, str) and _utf8(i) for i in ids):
        raise HTTPException(400, '"ids" is a list of entry ids as strings: ["12", "1:7"]')
    return ids


def _utf8(text: str) -> bool:
    """Whether *text* can be sent to Redis (a lone surrogate, ``"\\ud800"``, failed in
    redis-py's encoding: a 500); an id with a tab or a space is one to act on."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


async def form_action(request: Request, spider: str, name: str) -> HTMLResponse:
    """``POST /crawls/SPIDER/actions/NAME``: its confirmation page, or once confirmed,
    its report."""
    action = action_named(name)
    await known_crawl(request, spider)
    form = await _read_form(request)
    if not _guard.same(text_of(form.get(_guard.CSRF_FIELD)), request.state.csrf):
        raise HTTPException(403, "the form's CSRF token is missing or stale: reload the page")
    if form.get("confirm") == "yes":
        selected = _confirmed(action, form)
        done, note = await _perform(request, spider, action, selected)
        said = report(action, done, len(selected)) + (f". Note: {note}" if note else "")
        return render(request, "done.html", report=said, spider=spider, action=action)
    ids = [text_of(i) or "" for i in form.getlist("ids")]
    scope_filter = form.get("scope") == "filter"
    flt = await filter_from(request, form) if scope_filter else None
    # no row ticked: the page says nothing is selected (it was a 400 naming the form's fields)
    chosen = scope_filter or ids
    given = [] if scope_filter else ids
    selected = await _selection(request, spider, action, given, flt) if chosen else []
    _refuse_spaced(selected)
    shown = selected[:CONFIRM_LISTED]
    if action.table == GATES:  # the crawl page's gates: the domains themselves
        urls = {domain: f"the gate of {domain}" for domain in shown}
    else:
        urls = await urls_of(request, spider, action.table, shown) if action.table else {}
    context = {"spider": spider, "action": action, "selected": selected}
    return render(request, "confirm.html", urls=urls, **context)


async def _read_form(request: Request) -> Any:
    try:
        reading = request.form(max_part_size=SELECTION_BYTES)
    except TypeError:  # Starlette before 0.40 has no limit to lift
        reading = request.form()
    return await reading


def _refuse_spaced(ids: list[str]) -> None:
    """A 400 for an id holding whitespace: the confirmation carries its ids in one field,
    separated by spaces (no id scrapy-ha makes holds any; one written by hand would come
    back as two ids, or none). The action API takes such an id as it is."""
    for entry_id in ids:
        if entry_id.split() != [entry_id]:
            raise HTTPException(
                400,
                f"entry id {entry_id!r} holds whitespace or is empty, and a confirmation page "
                "cannot carry it: act on it with the action API (POST /api/crawls/SPIDER/"
                "actions/NAME) or scrapy-ha dlq",
            )


def _confirmed(action: Action, form: Any) -> list[str]:
    """The entries a confirmed form acts on: those its confirmation page listed (its
    ``selection``) or the ``ids`` it names, never a filter matched again (entries that
    arrived since were not confirmed)."""
    if action.table is None:
        return []
    selection = text_of(form.get("selection"))
    if selection is not None:
        return selection.split()
    ids = [i for i in form.getlist("ids") if isinstance(i, str)]
    if not ids:
        raise HTTPException(
            400, "this confirmation names no entries: go back to the table and act again"
        )
    return ids


def text_of(value: Any) -> str | None:
    return value if isinstance(value, str) else None


__all__ = ["action_named", "api_action", "form_action", "text_of"]
