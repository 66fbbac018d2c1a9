"""docs/reference.md lists what the code has: every setting scrapy-ha knows with the
default the code reads it with, every ``ha/...`` stat the code sets, every Redis key
``scrapy_ha/keys.py`` builds (and ``keys.py``'s own table every key the reference lists).
Read from the source, so a new stat, key or setting fails here until it is documented.
An audit found a meta key, two Redis keys of the ``keys.py`` table and a crawl-discovery
sentence behind the code; these tests keep the lists, not the prose, in step."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path
from typing import Any

from scrapy_ha.config.known import KNOWN, TOKEN_ENV

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "scrapy_ha"
REFERENCE = (ROOT / "docs" / "reference.md").read_text()


def section(title: str) -> str:
    """The reference from ``## title`` to the next ``## `` heading."""
    return REFERENCE.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def sources() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text())) for path in sorted(PACKAGE.rglob("*.py"))]


SOURCES = sources()


# -- settings -------------------------------------------------------------------------


def documented_settings() -> dict[str, str]:
    """Setting -> its default cell, from every table row of the settings' part."""
    rows = {}
    for line in REFERENCE.split("\n## Request meta keys", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) >= 3:
            for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", cells[0]):
                rows[name] = cells[1]
    return rows


def test_every_setting_has_a_row_and_every_row_is_a_setting():
    rows = {name for name in documented_settings() if name.startswith("HA_")}
    assert KNOWN - {TOKEN_ENV} - rows == set(), "settings without a row in docs/reference.md"
    assert rows - KNOWN == set(), "rows of settings scrapy-ha does not read"


def code_defaults() -> dict[str, set[Any]]:
    """Setting -> the defaults ``check.<kind>(settings, "NAME", default)`` reads it with,
    where the default is a constant of its module (not computed from other settings)."""
    found: dict[str, set[Any]] = {}
    for path, tree in SOURCES:
        module = None
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and ast.unparse(node.func).startswith("check.")):
                continue
            args = node.args
            if len(args) < 3 or not isinstance(args[1], ast.Constant):
                continue
            module = module or importlib.import_module(
                ".".join(path.relative_to(ROOT).with_suffix("").parts)
            )
            try:
                value = eval(ast.unparse(args[2]), vars(module))  # noqa: S307 (our source)
            except NameError:  # computed at run time: concurrency, the lease time...
                continue
            if isinstance(value, bool | int | float | str):
                found.setdefault(args[1].value, set()).add(value)
    return found


def documented_default(cell: str) -> Any:
    """The default cell's first literal (`30` s, `"set"`, `False`), or None if it is
    prose (`CONCURRENT_REQUESTS`, `host:pid...`)."""
    first = re.match(r"`([^`]*)`", cell)
    try:
        return ast.literal_eval(first.group(1)) if first else None
    except (ValueError, SyntaxError):
        return None


def test_each_documented_default_is_the_one_the_code_reads():
    rows, defaults = documented_settings(), code_defaults()
    compared, wrong = 0, {}
    for name, cell in rows.items():
        documented = documented_default(cell)
        if documented is None or name not in defaults or "," in cell.split("|")[0]:
            continue
        compared += 1
        if defaults[name] != {documented}:
            wrong[name] = (cell, defaults[name])
    assert wrong == {}
    assert compared > 50  # the check itself: it reads the tables


# -- stats ----------------------------------------------------------------------------


#: A stat as the reference writes it: ``ha/retry/<class>``, ``ha/proxy/<host:port>/requests``,
#: ``ha/dupefilter/*``, ``ha/proxy/...``.
DOCUMENTED_STAT = r"`(ha/[a-z0-9_/<>*:.]+)`"


def stat_patterns() -> set[str]:
    """Every ``ha/...`` string literal of the package, an f-string's fields as ``*``."""
    found = set()
    for _, tree in SOURCES:
        parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
        for node in ast.walk(tree):
            if id(node) in parts:  # a piece of an f-string: the f-string is the stat
                continue
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            elif isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "*" for v in node.values)
            else:
                continue
            if re.fullmatch(r"ha/[a-z0-9_/*]*", text) and text != "ha/":
                found.add(text)
    return found


def as_regex(stat: str) -> re.Pattern[str]:
    """A stat as written, ``<class>`` and ``*`` standing for any part."""
    parts = re.split(r"(<[^>]+>|\*|\.\.\.)", stat)
    wild = ("*", "...")
    return re.compile(
        "".join(".+" if p in wild or p.startswith("<") else re.escape(p) for p in parts)
    )


def test_every_stat_the_code_sets_is_in_the_reference():
    documented = [as_regex(s) for s in re.findall(DOCUMENTED_STAT, REFERENCE)]
    missing = set()
    for stat in stat_patterns():
        probe = stat.replace("*", "x") + ("x" if stat.endswith("/") else "")
        if not any(d.fullmatch(probe) or d.fullmatch(stat) for d in documented):
            missing.add(stat)
    assert missing == set(), "stats docs/reference.md does not list"


def test_every_stat_of_the_stats_table_is_set_somewhere():
    produced = [as_regex(s + ("*" if s.endswith("/") else "")) for s in stat_patterns()]
    listed = set(re.findall(DOCUMENTED_STAT, section("Stats").split("\n| ", 1)[1]))
    unset = {
        stat
        for stat in listed
        if not any(p.fullmatch(re.sub(r"<[^>]+>|\*", "x", stat)) for p in produced)
    }
    assert unset == set(), "stats docs/reference.md lists that no code sets"


# -- Redis keys -----------------------------------------------------------------------

KEYS_PY = PACKAGE / "keys.py"


def built_key_names() -> set[str]:
    """The names keys.py builds: ``_Key("ready")``, ``_key(f"grant:{...}")`` as ``grant:``."""
    source = KEYS_PY.read_text().split('"""', 2)[2]
    names = set(re.findall(r'_Key\("([a-z_:]+)"', source))
    names |= set(re.findall(r'"([a-z_]+)"', re.search(r"for n in \(([^)]*)\)", source)[1]))
    names |= {f"{n}:" for n in re.findall(r'_(?:task_)?key\(f?"([a-z_]+):', source)}
    names |= {f"{n}:" for n in re.findall(r'_task_key\("([a-z_]+)"', source)}
    return names


def reference_key_rows() -> set[str]:
    rows = set()
    for line in section("Redis keys").splitlines():
        if line.startswith("| `ha:"):
            rows |= set(re.findall(r"`ha:\{S\}:([^`]+)`", line.split("|")[1]))
    return rows


def head(key: str) -> str:
    """A key's name up to its first placeholder: ``bloom:s<slot>:...`` -> ``bloom:s``."""
    return key.split("<", 1)[0]


def test_every_key_keys_py_builds_has_a_row_in_the_reference():
    rows = {head(k) for k in reference_key_rows()}
    assert len(rows) > 50  # the check itself: it reads the table
    assert built_key_names() - rows == set()


def test_every_key_of_the_reference_is_in_the_table_of_keys_py():
    """The reference calls keys.py's docstring the authoritative list."""
    table = KEYS_PY.read_text().split('"""', 2)[1]
    named = {head(k) for k in re.findall(r"``(?:ha:\{books\}:)?([a-z_:]+(?:<[^`]*)?)``", table)}
    missing = {k for k in reference_key_rows() if head(k) not in named}
    assert missing == set()


# -- commands named in the documents ----------------------------------------------------


def command_names() -> dict[str, set[str]]:
    """Each command of the CLI -> its subcommands (none for a command without)."""
    import argparse  # noqa: PLC0415

    from scrapy_ha.cli.grammar import build_parser  # noqa: PLC0415

    def choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return dict(subs[0].choices) if subs else {}

    return {name: set(choices(sub)) for name, sub in choices(build_parser()).items()}


def test_every_command_the_documents_name_exists():
    """``scrapy-ha requeue`` (for ``dlq requeue``) was named in compatibility.md."""
    commands, wrong = command_names(), []
    for document in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for line in re.findall(r"`scrapy-ha ([a-z][^`]*)`", document.read_text()):
            if ": " in line:  # a log line (`scrapy-ha stopped before it reached Redis: ...`)
                continue
            command, sub = [*line.split()[:2], ""][:2]
            subs = commands.get(command)
            if subs is None or (subs and re.fullmatch("[a-z-]+", sub) and sub not in subs):
                wrong.append(f"{document.name}: scrapy-ha {line}")
    assert wrong == []


#: A boolean setting's default as prose names it: ``HA_EARLY_DOWNLOAD`` (off by default).
SAID_DEFAULT = r"`(HA_[A-Z0-9_]+)`\W{0,3}\((on|off) by default"


def test_every_on_or_off_by_default_the_documents_say_is_the_code_default():
    """docs/compatibility.md and docs/benchmarks.md called ``HA_EARLY_DOWNLOAD`` "off by
    default" for days after its default became ``True``."""
    defaults, wrong, compared = code_defaults(), {}, 0
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for name, said in re.findall(SAID_DEFAULT, path.read_text()):
            if defaults.get(name, set()) & {True, False}:
                compared += 1
                if defaults[name] != {said == "on"}:
                    wrong[f"{path.name}: {name}"] = (said, defaults[name])
    assert wrong == {}
    assert compared > 0  # the check itself: the documents name one
