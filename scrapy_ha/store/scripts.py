"""The Lua scripts of the queue, assembled once at import from ``scrapy_ha/store/lua/``.

Each rule of the data model that several scripts keep (the server clock, the lease-token
check, the back queues and their elements ``"<id> <payload>"``, the priority scale, the
dead-letter retention, ...) has one definition in ``scrapy_ha/store/lua/lib/<name>.lua``.
A script pulls the ones it needs with a line ``--- @include "<name>"`` after its header; a
library file may include others on its first lines. Each file is included once per script,
before the code that uses it (Lua's ``local function`` must be defined before use), and
``lib/prelude.lua`` comes first in every script: the script Redis runs is one
self-contained text. Every key comes through ``KEYS``, but the back queues (one per host
and priority), the exact dupefilter's buckets and the bitmaps of the Bloom filter's time
slices, which a script names from the key of their prefix it is given: that prefix
carries the crawl's hash tag, so the names it makes are in the slot of the call's other
keys (``lib/frontier.lua``, ``lib/seen.lua``, ``lib/aged.lua``).

The priority scale is written into ``lib/priority.lua`` from the constants below, so that
the scripts and the worker clamp priorities the same way.

On Redis 7+ the sync script runs as a function of a library built from the same files
(:mod:`.functions`), defined once: a library file's top-level statements other than its
functions (``local NAME = ...``, or a field of a table of its functions) run again at the
start of every call, so what a call keeps there (a tally) starts anew each time, as in a
script.
"""

from __future__ import annotations

import re
from importlib.resources import files

from scrapy_ha.keys import SEEN_SLICES

#: Score units per priority step: the sequence part of a pending score (entry ids up to
#: 2^40, a trillion requests per crawl) stays below one step, so priority always dominates.
PRIORITY_STEP = 2**40
#: Scrapy priorities are clamped to this range so that every score fits a double exactly
#: (4095 * 2^40 + 2^40 = 2^52, below 2^53).
MAX_PRIORITY = 4095

#: The values written for the ``{{NAME}}`` placeholders of the library.
CONSTANTS: dict[str, int] = {
    "PRIORITY_STEP": PRIORITY_STEP,
    "MAX_PRIORITY": MAX_PRIORITY,
    "SEEN_SLICES": SEEN_SLICES,
}

#: An include line: ``--- @include "name"`` alone on its line.
INCLUDE = re.compile(r'^--- @include "([a-z_]+)"[ \t]*$', re.MULTILINE)
#: A placeholder for a Python constant in a library file.
PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def read_lua(path: str) -> str:
    """The text of ``scrapy_ha/store/lua/<path>.lua`` as stored (includes not resolved)."""
    return files("scrapy_ha.store").joinpath("lua", f"{path}.lua").read_text(encoding="utf-8")


def _constant(match: re.Match[str]) -> str:
    name = match.group(1)
    if name not in CONSTANTS:
        raise ValueError(
            f"scrapy_ha/store/lua/lib: unknown placeholder {{{{{name}}}}}; "
            f"known are {', '.join(sorted(CONSTANTS))} (scrapy_ha/store/scripts.py CONSTANTS)"
        )
    return str(CONSTANTS[name])


def _expand(text: str, where: str, seen: set[str]) -> str:
    def include(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in seen:
            return ""
        seen.add(name)
        try:
            lib = read_lua(f"lib/{name}")
        except FileNotFoundError:
            raise ValueError(
                f"{where} includes {name!r}, but there is no scrapy_ha/store/lua/lib/{name}.lua"
            ) from None
        return _expand(lib, f"scrapy_ha/store/lua/lib/{name}.lua", seen).rstrip("\n")

    return INCLUDE.sub(include, text)


def assemble(name: str) -> str:
    """Script *name* as Redis runs it: its header, ``lib/prelude.lua``, then its text with
    the includes resolved and the constants written in."""
    text = _expand(read_lua(name), f"scrapy_ha/store/lua/{name}.lua", set())
    lines = text.splitlines(keepends=True)
    end = next((i for i, line in enumerate(lines) if not line.startswith("-- ")), len(lines))
    text = "".join(lines[:end]) + read_lua("lib/prelude") + "".join(lines[end:])
    return PLACEHOLDER.sub(_constant, text)


SYNC_LUA = assemble("sync")
RENEW_LUA = assemble("renew")
RECLAIM_LUA = assemble("reclaim")
RELEASE_LUA = assemble("release")
DEAD_LUA = assemble("dead")
COUNTS_LUA = assemble("counts")
FINISH_LUA = assemble("finish")
JOIN_LUA = assemble("join")
FENCE_LUA = assemble("fence")
FEED_LUA = assemble("feed")
RETRY_LUA = assemble("retry")
GATE_LUA = assemble("gate")
REQUEUE_LUA = assemble("requeue")
PURGE_LUA = assemble("purge")
CHECKPOINT_LUA = assemble("checkpoint")
ALERT_LUA = assemble("alert")
ARCHIVED_LUA = assemble("archived")
SET_ASIDE_LUA = assemble("set_aside")
JAR_MERGE_LUA = assemble("jar_merge")
JAR_SET_ASIDE_LUA = assemble("jar_set_aside")
DUE_LUA = assemble("due")
ITEMS_ACK_LUA = assemble("items_ack")
ITEMS_ADD_LUA = assemble("items_add")
ITEMS_STATE_LUA = assemble("items_state")
RUN_LUA = assemble("run")
REVISIT_LUA = assemble("revisit")
CONVERT_LUA = assemble("convert")
FORGET_LUA = assemble("forget")
DROP_BUCKETS_LUA = assemble("drop_buckets")
SEEN_CHECK_LUA = assemble("seen_check")
