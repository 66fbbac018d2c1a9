"""The crawl's hot script loaded once as a Redis Functions library (Redis 7.0 and later).

Run with ``EVALSHA``, a script defines its whole library (``lib/*.lua``: about 110
``local function`` for the sync script) at every call, before its first line of work: about
187,000 server instructions per call, of about 3.2 million for a call of 10 requests
(docs/benchmarks.md). Registered with ``FUNCTION LOAD``, the library is defined once, when
it is loaded, and a call (``FCALL``) runs only the script's own code: about 6 % fewer
instructions per request.

The library is assembled from the same files as the scripts (:mod:`.scripts`); for each
script of :data:`FUNCTION_SCRIPTS`, inside a ``do ... end`` block of its own:

- its libraries' ``local function`` definitions, as in the script;
- their other top-level statements (constants and the tallies a call keeps: the per-call
  state, such as ``lib/stats.lua``'s ``TALLY``) run when the library loads and again, as
  assignments, at the start of every call (``__reset_<n>``), so a call starts from the
  state a fresh ``EVAL`` starts from;
- the script's own code as a function (``__main``) whose parameters are ``KEYS``, ``ARGV``
  and the library functions it calls (a Lua function reaches at most 60 upvalues; it may
  hold 200 locals, parameters included).

Its name carries a hash, ``scrapy_ha_<hash>``, of what its code is made from (so it changes
with the code, which is assembled only when a server lacks it), and so does each function's,
``scrapy_ha_<hash>_<script>`` (function names are unique across a server's libraries): two
versions of scrapy-ha on one Redis, during a rolling upgrade, each load and call their own
library and never replace the other's; a worker loads it without ``REPLACE``, so of
workers that find it missing at once one loads it and the others are told it exists.
:class:`LibraryScript` calls a function like redis-py's registered scripts are called;
where functions are not available (Redis 6.2, an ACL without ``FCALL`` or ``FUNCTION``) it
runs the script with ``EVALSHA``, as before.

On Redis Cluster a call goes where an ``EVALSHA`` with the same keys goes, found the same
way: redis-py (5.0 to 8.1, ``redis/asyncio/cluster.py``, ``_determine_slot``) reads the keys
of ``EVAL`` and ``EVALSHA`` from their arguments, but asks a server (``COMMAND GETKEYS``, at
the client's default node, twice per call) for those of ``FCALL``, a command whose keys
move. :func:`route_by_keys` tells the cluster client ``FCALL``'s keys from its arguments
(``tests/test_redis_functions.py`` counts the ``COMMAND GETKEYS`` a cluster receives: a
redis-py that stops asking the parser fails it, not a crawl).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio

from scrapy_ha.store import scripts

if TYPE_CHECKING:
    from collections.abc import Sequence

logger = logging.getLogger(__name__)

__all__ = [
    "FUNCTION_SCRIPTS",
    "LIBRARY_NAME",
    "LibraryScript",
    "function_name",
    "library_code",
    "library_name",
    "route_by_keys",
]

#: The scripts registered as functions: the sync script, called once per round by every
#: worker (all of a request's Redis CPU but its renewals). The others are called rarely
#: (a retry, a reclaim every 10 s, the operator's tools) and keep ``EVALSHA``.
FUNCTION_SCRIPTS = ("sync",)
#: The prefix of the library's name and of its functions' (``FUNCTION LIST LIBRARYNAME``).
LIBRARY_PREFIX = "scrapy_ha_"
#: Hex digits of the code's SHA-1 in the names: a collision of two versions' libraries is
#: as unlikely as one of 64 random bits.
HASH_DIGITS = 16
#: Where the name goes in the library's code before its hash is known.
NAME_SLOT = "{{LIBRARY}}"

#: A top-level statement: a line that starts at column 0 and is not a comment or the end of
#: a block (``end``, ``}``, ``)``).
_STATEMENT = re.compile(r"^(?!--|end\b|[})\]])\S")
_DEFINITION = re.compile(r"^(?:local )?function ([\w.]+)")
_NAMESPACE = re.compile(r"^function (\w+)\.", re.MULTILINE)
_LOCAL = re.compile(r"^local ([\w, ]+?)\s*(=|$)", re.DOTALL)
_WORD = re.compile(r"\b[A-Za-z_]\w*\b")
#: A whole name that is not a field (``x.name``): what :func:`_globals` may rewrite (one
#: pattern for all names: a pattern per name cost a compile each at every import).
_NAME = re.compile(r"(?<![\w.])[A-Za-z_]\w*")


def _code(text: str) -> str:
    """*text* without its Lua comments (no script puts ``--`` inside a string)."""
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())


def _constants(text: str) -> str:
    """*text* with the Python constants written in (:data:`scripts.CONSTANTS`)."""
    return scripts.PLACEHOLDER.sub(scripts._constant, text)


def _statements(text: str) -> list[tuple[str, str]]:
    """The top-level statements of a library file, in order: (kind, text), kind
    ``"function"`` for a function definition, ``"data"`` for any other statement."""
    out: list[list[str]] = [["comment", ""]]
    for line in text.splitlines(keepends=True):
        if _STATEMENT.match(line):
            out.append(["function" if _DEFINITION.match(line) else "data", line])
        else:
            out[-1][1] += line
    return [(kind, body) for kind, body in out]


def _at_load(statements: list[tuple[str, str]], namespaces: set[str]) -> str:
    """The library file as it runs when the library loads: its functions defined, its data
    declared (its values come with each call: ``redis.call`` cannot even be read before),
    a namespace table made (its functions are fields of it)."""
    out = []
    for kind, text in statements:
        match = _LOCAL.match(_code(text).strip()) if kind == "data" else None
        if match and match.group(1).strip() not in namespaces:
            text = f"local {match.group(1).strip()}\n"
        out.append(text)
    return "".join(out)


def _lib_order(text: str, seen: set[str]) -> list[str]:
    """The library files *text* includes, each after the ones it includes (the order of
    :func:`scripts.assemble`)."""
    order: list[str] = []
    for name in scripts.INCLUDE.findall(text):
        if name not in seen:
            seen.add(name)
            order += _lib_order(scripts.read_lua(f"lib/{name}"), seen)
            order.append(name)
    return order


def _globals(assignment: str) -> str:
    """*assignment* with each global it reads under its own name (``ipairs = ipairs``, the
    prelude's way to read a global once) read from ``_G``: in a function the name is the
    library's local, declared when the library loaded."""
    lhs, rhs = assignment.split("=", 1)
    names = {n.strip() for n in lhs.split(",")}
    rhs = _NAME.sub(lambda m: f"_G.{m[0]}" if m[0] in names else m[0], rhs)
    return f"{lhs}={rhs}"


def _reset(statements: list[tuple[str, str]], namespaces: set[str]) -> str:
    """The data statements as assignments: what a call runs first (a namespace table, which
    holds functions, is kept; its data fields are assigned by their own statements)."""
    lines = []
    for kind, text in statements:
        if kind != "data":
            continue
        body = _code(text).strip()
        if match := _LOCAL.match(body):
            names = match.group(1)
            if names.strip() in namespaces:
                continue
            body = f"{names} = nil" if match.group(2) == "" else _globals(body[len("local ") :])
        lines.append(body)
    return "\n".join(lines)


def _block(name: str) -> str:
    """Script *name* as a block of the library: its libraries, once, and the function."""
    own = scripts.read_lua(name)
    libs = ["prelude", *_lib_order(own, set())]
    parts, resets, functions = [f"do -- scrapy_ha/store/lua/{name}.lua\n"], [], set()
    for i, lib in enumerate(libs):
        text = _constants(scripts.INCLUDE.sub("", scripts.read_lua(f"lib/{lib}")))
        statements, namespaces = _statements(text), set(_NAMESPACE.findall(text))
        parts.append(_at_load(statements, namespaces).rstrip("\n") + "\n")
        functions |= {m[1] for m in map(_DEFINITION.match, (t for _, t in statements)) if m}
        reset = _reset(statements, namespaces)
        if reset:
            parts.append(f"local function __reset_{i}()\n{reset}\nend\n")
            resets.append(f"__reset_{i}()")
    body = _constants(scripts.INCLUDE.sub("", own))
    used = sorted(set(_WORD.findall(_code(body))) & {f for f in functions if "." not in f})
    params = ", ".join(["KEYS", "ARGV", *used])
    parts.append(f"local function __main({params})\n{body.rstrip()}\nend\n")
    parts.append(f"local __fns = {{{', '.join(used)}}}\n")
    parts.append(
        f"redis.register_function('{NAME_SLOT}_{name}', function(keys, args)\n"
        f"  {' '.join(resets)}\n"
        "  return __main(keys, args, unpack(__fns))\n"
        "end)\nend\n"
    )
    return "".join(parts)


def library_name(names: Sequence[str] = FUNCTION_SCRIPTS) -> str:
    """The name of the library of scripts *names*, without its code: the hash of what the
    code is made from (each script's file and its libraries', the constants written in, and
    the two modules that assemble it, this one and :mod:`.scripts`). The same files give the
    same code, so the name still changes with the code; the code itself (regular expressions
    over every library file, about 50 million instructions) is made only when a server lacks
    the library (:func:`library_code`), not at every worker's start."""
    digest = hashlib.sha1(usedforsecurity=False)
    for path in (__file__, scripts.__file__):
        digest.update(Path(path).read_bytes())
    digest.update(repr(sorted(scripts.CONSTANTS.items())).encode())
    for name in names:
        for path in (
            name,
            *(f"lib/{lib}" for lib in ("prelude", *_lib_order(scripts.read_lua(name), set()))),
        ):
            digest.update(f"\0{path}\0{scripts.read_lua(path)}".encode())
    return f"{LIBRARY_PREFIX}{digest.hexdigest()[:HASH_DIGITS]}"


def library_code(names: Sequence[str] = FUNCTION_SCRIPTS) -> tuple[str, str]:
    """(name, code) of the library of scripts *names*: ``FUNCTION LOAD``'s argument."""
    library = library_name(names)
    head = (
        f"#!lua name={library}\n"
        "-- scrapy-ha's crawl scripts as functions (scrapy_ha/store/functions.py), named\n"
        f"-- {library}_<script>; remove with FUNCTION DELETE {library}\n"
    )
    template = "".join(_block(name) for name in names)
    return library, head + template.replace(NAME_SLOT, library)


#: This version's library's name (its code: :data:`LIBRARY_CODE`, made on first read).
LIBRARY_NAME = library_name()


@functools.cache
def _library_code() -> str:
    return library_code()[1]


def __getattr__(name: str) -> str:
    """``LIBRARY_CODE``: this version's library's code, assembled on first read."""
    if name == "LIBRARY_CODE":
        return _library_code()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def function_name(script: str) -> str:
    """The name of *script*'s function in this version's library."""
    return f"{LIBRARY_NAME}_{script}"


def _missing(exc: Exception) -> bool:
    """The server lacks the library (restarted without persistence, a replica that never
    had it, ``FUNCTION FLUSH``): load it and call again."""
    return str(exc).startswith("Function not found")


def _exists(exc: Exception) -> bool:
    """The library is there already: another worker loaded it since this one's call found
    it missing (the same name, the same code)."""
    return str(exc).startswith("Library ") and str(exc).endswith("already exists")


def _unsupported(exc: Exception) -> bool:
    """The server cannot run functions for this client: Redis 6.2 (no ``FCALL``: a server's
    ``unknown command``, or redis-py's cluster client's own ``... command doesn't exist in
    Redis commands``, read from ``COMMAND``), or an ACL that denies ``FCALL`` or
    ``FUNCTION``."""
    text = str(exc)
    return (
        isinstance(exc, redis.exceptions.NoPermissionError)
        or text.startswith(("unknown command", "NOPERM"))
        or text.endswith("command doesn't exist in Redis commands")
    )


#: The commands whose keys :func:`route_by_keys` reads from their arguments: ``FCALL
#: function numkeys key... arg...``.
FCALLS = ("FCALL", "FCALL_RO")


def route_by_keys(client: Any) -> bool:
    """Make the Redis Cluster *client* read ``FCALL``'s keys from its arguments, as it reads
    ``EVALSHA``'s, instead of asking its default node with ``COMMAND GETKEYS`` at every
    call: two round trips carrying the call's arguments, and a call that fails while that
    node, which may hold none of the crawl, is down. Wraps the client's
    ``commands_parser.get_keys`` (redis-py 5.0 to 8.1); False if the client has none."""
    parser: Any = getattr(client, "commands_parser", None)
    get_keys = getattr(parser, "get_keys", None)
    if get_keys is None:
        return False
    if getattr(get_keys, "reads_fcall_keys", False):
        return True

    async def keys_of(*args: Any) -> Any:
        if len(args) > 2 and str(args[0]).upper() in FCALLS:
            return args[3 : 3 + int(args[2])]
        return await get_keys(*args)

    keys_of.reads_fcall_keys = True  # type: ignore[attr-defined]
    try:
        parser.get_keys = keys_of
    except AttributeError:  # a parser with __slots__ only: it keeps asking
        return False
    return True


class LibraryScript:
    """One script of the library, called as redis-py's registered scripts are
    (``await script(keys=..., args=...)``): ``FCALL`` of its function, the library loaded
    when the server lacks it; ``EVALSHA`` of the script's text where the server runs no
    functions, and for a call refused because Redis is over ``maxmemory`` (as a function,
    the call is refused before it starts; as a script, only its first write that may grow
    memory is: an ack alone still frees memory), whether the first ``FCALL``, the library's
    load or the ``FCALL`` after it was refused."""

    def __init__(self, client: Any, script: str, *, library: tuple[str, str] | None = None) -> None:
        if script not in FUNCTION_SCRIPTS:
            raise ValueError(f"{script!r} is not in the library ({', '.join(FUNCTION_SCRIPTS)})")
        self.client = client
        #: (name, code) of the library (another version's in a test of a rolling upgrade);
        #: this version's code is assembled only if a server lacks the library
        self.library = library
        self.name = library[0] if library else LIBRARY_NAME
        self.function = f"{self.name}_{script}"
        self.evalsha = scripts.Registered(client, script)  # its text assembled on first use
        #: a Redis Cluster client: FCALL routed by its keys, the library loaded by node
        self.cluster = isinstance(client, redis.asyncio.RedisCluster)
        if self.cluster:
            route_by_keys(client)
        #: False once the server said it runs no functions: every call is an EVALSHA
        self.functions = True

    async def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        if self.functions:
            try:
                return await self._function(keys, args)
            except redis.exceptions.RedisError as exc:
                if not self._evalsha_instead(exc):
                    raise
        return await self.evalsha(keys=keys, args=args)

    async def _function(self, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """FCALL; the library loaded and FCALL again if the server lacks it."""
        try:
            return await self._fcall(keys, args)
        except redis.exceptions.ResponseError as exc:
            if not _missing(exc):
                raise
        await self._load(keys)
        return await self._fcall(keys, args)

    def _evalsha_instead(self, exc: redis.exceptions.RedisError) -> bool:
        """Whether a call whose function, or its load, failed with *exc* runs with EVALSHA:
        the server runs no functions (from now on), it is over ``maxmemory`` (this call), or
        it lost the library again between its load and the call (a failover: this call)."""
        if _unsupported(exc):
            self._give_up(exc)
            return True
        return isinstance(exc, redis.exceptions.OutOfMemoryError) or _missing(exc)

    async def _fcall(self, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        return await self.client.fcall(self.function, len(keys), *keys, *args)

    async def _load(self, keys: Sequence[Any]) -> None:
        """Load this version's library where the call runs (on a cluster, the node of its
        keys only: a sync never waits on another node). Without ``REPLACE``: workers that
        find it missing at once load it once, and a library is never compiled and
        replicated again for nothing."""
        code = self.library[1] if self.library else _library_code()
        try:
            if self.cluster and keys:
                node = self.client.get_node_from_key(keys[0])
                await self.client.execute_command("FUNCTION LOAD", code, target_nodes=node)
            else:
                await self.client.function_load(code)
        except redis.exceptions.ResponseError as exc:
            if not _exists(exc):
                raise
            return
        logger.info("Loaded the function library %s into Redis", self.name)

    def _give_up(self, exc: Exception) -> None:
        self.functions = False
        logger.info(
            "Redis runs no functions for this client (%s): the scripts run with EVALSHA", exc
        )
