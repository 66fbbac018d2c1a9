"""The Lua scripts of the queue, assembled from ``scrapy_ha/store/lua/``, each once, on first
use (``scripts.SYNC_LUA``): a worker runs a handful of the 30, and assembling them all at
import cost every process about 130 million instructions (``bench/crawl_instructions.py``).

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

import functools
import re
from importlib.resources import files
from typing import TYPE_CHECKING, Any

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


@functools.cache
def read_lua(path: str) -> str:
    """The text of ``scrapy_ha/store/lua/<path>.lua`` as stored (includes not resolved); read
    once per process (a library file is included by most scripts and by the functions'
    library: read each time, the reads were half of the assembly's cost)."""
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


#: The scripts of ``scrapy_ha/store/lua/``, each read as ``<NAME>_LUA`` (``SYNC_LUA``).
SCRIPTS = (
    "sync",
    "renew",
    "reclaim",
    "release",
    "dead",
    "counts",
    "finish",
    "join",
    "leave",
    "relink",
    "fence",
    "feed",
    "retry",
    "gate",
    "gate_open",
    "requeue",
    "purge",
    "checkpoint",
    "alert",
    "archived",
    "set_aside",
    "jar_merge",
    "jar_set_aside",
    "jar_login",
    "jar_lift",
    "due",
    "items_ack",
    "items_add",
    "items_aside",
    "items_leave",
    "items_state",
    "run",
    "revisit",
    "convert",
    "forget",
    "drop_buckets",
    "seen_check",
    "proxy_cd_load",
    "dictionary",
    "gone",
)

if TYPE_CHECKING:  # what __getattr__ gives, assembled on first use
    SYNC_LUA: str
    RENEW_LUA: str
    RECLAIM_LUA: str
    RELEASE_LUA: str
    DEAD_LUA: str
    COUNTS_LUA: str
    FINISH_LUA: str
    JOIN_LUA: str
    LEAVE_LUA: str
    RELINK_LUA: str
    FENCE_LUA: str
    FEED_LUA: str
    RETRY_LUA: str
    GATE_LUA: str
    GATE_OPEN_LUA: str
    REQUEUE_LUA: str
    PURGE_LUA: str
    CHECKPOINT_LUA: str
    ALERT_LUA: str
    ARCHIVED_LUA: str
    SET_ASIDE_LUA: str
    JAR_MERGE_LUA: str
    JAR_SET_ASIDE_LUA: str
    JAR_LOGIN_LUA: str
    JAR_LIFT_LUA: str
    DUE_LUA: str
    ITEMS_ACK_LUA: str
    ITEMS_ADD_LUA: str
    ITEMS_ASIDE_LUA: str
    ITEMS_LEAVE_LUA: str
    ITEMS_STATE_LUA: str
    RUN_LUA: str
    REVISIT_LUA: str
    CONVERT_LUA: str
    FORGET_LUA: str
    DROP_BUCKETS_LUA: str
    SEEN_CHECK_LUA: str
    PROXY_CD_LOAD_LUA: str
    DICTIONARY_LUA: str
    GONE_LUA: str


def script_text(script: str) -> str:
    """Script *script* of :data:`SCRIPTS` as Redis runs it, assembled at its first use and
    kept (the module's ``<SCRIPT>_LUA`` from then on, never assembled again)."""
    name = f"{script.upper()}_LUA"
    text: str | None = globals().get(name)
    if text is None:
        if script not in SCRIPTS:
            raise ValueError(f"no script {script!r} in scrapy_ha/store/lua/ ({', '.join(SCRIPTS)})")
        text = globals()[name] = assemble(script)
    return text


def __getattr__(name: str) -> str:
    """``<NAME>_LUA``: :func:`script_text` of ``<name>``."""
    script = name.removesuffix("_LUA").lower()
    if not name.endswith("_LUA") or script not in SCRIPTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return script_text(script)


class Registered:
    """Script *script* of :data:`SCRIPTS` registered with *client* (``register_script``, a
    hash of its text) at its first call, not before: a queue holds a dozen scripts, and a
    worker calls few of them. Called as redis-py's registered scripts are."""

    __slots__ = ("_client", "_script", "_registered")

    def __init__(self, client: Any, script: str) -> None:
        if script not in SCRIPTS:
            raise ValueError(f"no script {script!r} in scrapy_ha/store/lua/ ({', '.join(SCRIPTS)})")
        self._client = client
        self._script = script
        self._registered: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._registered is None:
            self._registered = self._client.register_script(script_text(self._script))
        return self._registered(*args, **kwargs)
