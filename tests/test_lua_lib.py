"""The Lua library: every script assembles, each shared rule has one definition, and the
assembled scripts compile on the real redis-server."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.resources import files
from typing import TYPE_CHECKING

import pytest

from scrapy_ha.store import functions as _functions
from scrapy_ha.store import scripts as _scripts
from scrapy_ha.store.wire import clamp_priority

if TYPE_CHECKING:
    import redis

LUA = files("scrapy_ha.store").joinpath("lua")
SCRIPTS = sorted(p.name[: -len(".lua")] for p in LUA.iterdir() if p.name.endswith(".lua"))
LIBS = sorted(p.name[: -len(".lua")] for p in LUA.joinpath("lib").iterdir())
FUNCTION = re.compile(r"^local function (\w+)\(", re.MULTILINE)

#: Each rule of the library, and what a copy of it looks like in a script's code.
COPIES = {
    "time: the server clock": r"redis_call\('TIME'\)",
    "lease: the token check": r"'\^\(%S\+\)'",
    "lease: the record's score": r"'\^%S\+ \(%S\+\)'|\.\. ' ' \.\. sc",
    "member: '<id> <payload>'": r"\.\. ' ' \.\.|string\.find\([^)]*' '",
    "priority: the scale": r"1099511627776|4095|2 ?\^ ?40|math\.max\(-",
    "counter: a counter that restarts": r"'INCR",
    "number: integers as text": r"'%\.0f'",
    "deadletter: the record and the retention": r"'-inf', now -|cjson\.encode",
    "types: the wrong-type check": r"holds a",
}


def code(text: str) -> str:
    """*text* without its Lua comments (no script puts ``--`` inside a string)."""
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())


def header(text: str) -> str:
    """The comment lines a script opens with (its KEYS / ARGV / returns / rule block)."""
    lines = text.splitlines(keepends=True)
    end = next(i for i, line in enumerate(lines) if not line.startswith("-- "))
    return "".join(lines[:end])


def test_the_scripts_are_the_ones_the_queue_loads():
    assert sorted(_scripts.SCRIPTS) == SCRIPTS


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_include_resolves_and_every_constant_is_written(name):
    text = _scripts.assemble(name)
    assert "@include" not in text and "{{" not in text
    assert text == getattr(_scripts, f"{name.upper()}_LUA")
    # the script's own header stays its first lines: what it does, KEYS, returns
    own = header(_scripts.read_lua(name))
    assert text.startswith(own) and own.startswith(f"-- {name}: ")
    assert "KEYS[1]" in own and "Returns" in own
    defined = FUNCTION.findall(text)
    assert len(defined) == len(set(defined)), f"{name}.lua defines a function twice"


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_library_function_is_defined_before_its_use(name):
    text = code(_scripts.assemble(name))
    for match in FUNCTION.finditer(text):
        first_use = re.search(rf"\b{match.group(1)}\(", text)
        assert first_use is not None and first_use.start() >= match.start(), (name, match[1])
    for lib in LIBS:
        for fn in FUNCTION.findall(_scripts.read_lua(f"lib/{lib}")):
            if re.search(rf"\b{fn}\(", code(_scripts.read_lua(name))):
                assert f"local function {fn}(" in text, f"{name}.lua uses {fn} without its include"


@pytest.mark.parametrize("name", SCRIPTS)
def test_no_script_hides_a_library_function_under_a_local_of_its_own(name):
    text = code(_scripts.assemble(name))
    for fn in FUNCTION.findall(text):
        hidden = re.search(rf"\blocal\s+(?:\w+\s*,\s*)*{fn}\b(?!\()", text)
        assert hidden is None, f"{name}.lua: {hidden[0] if hidden else ''!r} hides lib {fn}()"


@pytest.mark.parametrize("name", SCRIPTS)
def test_no_script_keeps_its_own_copy_of_a_library_rule(name):
    own = code(_scripts.read_lua(name))
    for rule, pattern in COPIES.items():
        assert not re.search(pattern, own), f"{name}.lua has its own copy of {rule}"


@pytest.mark.parametrize("lib", LIBS)
def test_each_library_function_has_a_header_and_a_user(lib):
    text = _scripts.read_lua(f"lib/{lib}")
    assert text.splitlines()[0].startswith(("-- lib/", "--- @include"))
    everywhere = "\n".join(code(_scripts.read_lua(name)) for name in SCRIPTS) + "\n".join(
        code(_scripts.read_lua(f"lib/{name}")) for name in LIBS
    )
    for fn in FUNCTION.findall(text):
        before = text[: text.index(f"local function {fn}(")]
        assert f"\n-- {fn}(" in before, f"lib/{lib}.lua: no header for {fn}"
        calls = len(re.findall(rf"(?<!function )\b{fn}\(", everywhere))
        assert calls > 0, f"lib/{lib}.lua: {fn} is called nowhere"


def test_an_unknown_include_or_constant_names_the_file_and_the_fix():
    with pytest.raises(ValueError, match=r"x\.lua includes 'nope'.*lib/nope\.lua"):
        _scripts._expand('--- @include "nope"\n', "x.lua", set())
    with pytest.raises(ValueError, match=r"\{\{NOPE\}\}.*MAX_PRIORITY"):
        _scripts.PLACEHOLDER.sub(_scripts._constant, "local x = {{NOPE}}")


def test_a_library_file_is_included_once_even_when_named_twice():
    text = _scripts._expand('--- @include "counter"\n--- @include "time"\n', "x.lua", set())
    assert text.count("local function now_ms(") == 1
    assert text.index("local function now_ms(") < text.index("local function take(")


def test_the_priority_scale_has_one_definition():
    # scores stay exact doubles; the scripts carry the worker's constants
    assert (_scripts.MAX_PRIORITY + 1) * _scripts.PRIORITY_STEP <= 2**53
    for name in ("sync", "feed", "retry", "requeue"):
        text = _scripts.assemble(name)
        assert f"local MAX_PRIORITY = {_scripts.MAX_PRIORITY}\n" in text
        assert f"local PRIORITY_STEP = {_scripts.PRIORITY_STEP}\n" in text
    assert clamp_priority(10**6) == _scripts.MAX_PRIORITY


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_compiles_on_redis(redis_client: redis.Redis, name):
    text = _scripts.assemble(name)
    sha = redis_client.script_load(text)
    assert redis_client.script_exists(sha) == [True]


@pytest.mark.parametrize("lib", ["prelude", *LIBS])
def test_what_a_library_file_keeps_between_calls_is_set_again_by_each(lib):
    # as a Redis function the library is defined once (scrapy_ha/store/functions.py): its
    # top-level data (constants, a call's tallies) must be statements each call runs again
    text = _functions._constants(_scripts.INCLUDE.sub("", _scripts.read_lua(f"lib/{lib}")))
    namespaces = set(_functions._NAMESPACE.findall(text))
    fields = "|".join(namespaces) or "-"
    for kind, body in _functions._statements(text):
        if kind == "data":
            statement = code(body).strip()
            assert re.match(rf"local [\w, ]+(=|$)|({fields})\.\w+", statement), (lib, statement)


def test_the_function_library_loads_and_lists_its_function(redis_client: redis.Redis):
    loaded = redis_client.function_load(_functions.LIBRARY_CODE, replace=True)
    assert loaded == _functions.LIBRARY_NAME.encode()
    (library,) = redis_client.function_list(library=_functions.LIBRARY_NAME)
    assert _functions.function_name("sync").encode() in str(library).encode()
    assert _functions.LIBRARY_NAME.startswith("scrapy_ha_") and len(_functions.LIBRARY_NAME) == 26


def test_a_worker_start_names_the_library_without_assembling_it():
    # the code (regular expressions over every library file) is made when a server lacks
    # it, not at every import: a worker's start-up paid about 50 million instructions
    code = (
        "import scrapy_ha.scheduler, scrapy_ha.store.functions as f; "
        "print('LIBRARY_CODE' in vars(f), f._library_code.cache_info().currsize)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "0"]


def test_the_library_name_follows_every_file_its_code_is_made_from(monkeypatch):
    name, code = _functions.library_code()
    assert name == _functions.LIBRARY_NAME and code.startswith(f"#!lua name={name}\n")
    read = _scripts.read_lua
    for changed in ("sync", "lib/prelude", "lib/stats", "lib/number"):
        monkeypatch.setattr(_scripts, "read_lua", lambda p, c=changed: read(p) + ("\n" * (p == c)))
        assert _functions.library_name() != name, changed
    monkeypatch.setattr(_scripts, "read_lua", read)
    monkeypatch.setitem(_scripts.CONSTANTS, "MAX_PRIORITY", 1)
    assert _functions.library_name() != name
    monkeypatch.undo()
    assert _functions.library_name() == name
