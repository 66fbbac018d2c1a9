"""A ``scrapy-ha`` command that reads only settings starts without importing Scrapy when
it runs outside any Scrapy project (Scrapy's import was half of every command's start),
and reads the settings it does read as Scrapy's would (scrapy_ha.config.bare)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest
from scrapy.settings import Settings

from scrapy_ha.cli import grammar
from scrapy_ha.cli.project import SETTINGS_ONLY
from scrapy_ha.config.bare import BareSettings
from tests.cli_seed import ROOT, dead_letters

if TYPE_CHECKING:
    from pathlib import Path

#: One command line of each module of SETTINGS_ONLY, on a crawl with dead letters.
COMMANDS = [
    ["status", "light"],
    ["dlq", "list", "light"],
    ["dlq", "purge", "light", "--all", "--dry-run"],
    ["delayed", "list", "light"],
    ["workers", "light"],
    ["gates", "list", "light"],
    ["checkpoints", "list", "light"],
    ["pause", "light"],
    ["stop", "light"],
    ["report", "light"],
    ["flush", "light", "--dry-run"],
]
#: Run as the console script runs, then say which of these modules were imported.
SCRIPT = (
    "import sys\n"
    "from scrapy_ha.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "print('SCRAPY', 'scrapy' in sys.modules, file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def _run(
    argv: list[str], cwd: Path, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, sys.executable, "-c", SCRIPT, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**_env(), "PYTHONPATH": str(ROOT), **(env or {})},
    )


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "SCRAPY_SETTINGS_MODULE"}


def _module(argv: list[str]) -> str:
    return str(grammar.build_parser().parse_args(argv).func.module).rpartition(".")[2]


def test_every_settings_only_module_is_tried():
    assert {_module(argv) for argv in COMMANDS} == SETTINGS_ONLY


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_a_settings_only_command_outside_a_project_does_not_import_scrapy(
    redis_url, tmp_path, argv
):
    dead_letters(redis_url, "light", [("http://a.test/1", "gone", 404)])
    done = _run(["--redis-url", redis_url, *argv], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "SCRAPY False" in done.stderr, done.stderr


def test_in_a_project_the_same_command_reads_the_projects_settings(redis_url, tmp_path):
    """A ``scrapy.cfg`` above the working directory is a project: its settings are read
    (Scrapy imported), here its key prefix."""
    (tmp_path / "scrapy.cfg").write_text("[settings]\ndefault = proj_settings\n")
    (tmp_path / "proj_settings.py").write_text(
        f"HA_KEY_PREFIX = 'mine'\nREDIS_URL = {redis_url!r}\n"
    )
    (tmp_path / "below").mkdir()
    done = _run(["status", "light"], tmp_path / "below")
    assert done.returncode == 1 and "under mine:{light}:*" in done.stderr, done.stderr
    assert "SCRAPY True" in done.stderr


def test_scrapys_windows_wide_configuration_is_a_project(redis_url, tmp_path):
    """Scrapy reads ``c:\\scrapy\\scrapy.cfg`` too (on Windows the machine's configuration;
    elsewhere a file of that name in the working directory): a project there is read, as
    before Scrapy was put off, not taken for no project (prefix ``ha``)."""
    (tmp_path / "c:\\scrapy\\scrapy.cfg").write_text("[settings]\ndefault = win_settings\n")
    (tmp_path / "win_settings.py").write_text(
        f"HA_KEY_PREFIX = 'mine'\nREDIS_URL = {redis_url!r}\n"
    )
    done = _run(["status", "light"], tmp_path, {"PYTHONPATH": f"{ROOT}:{tmp_path}"})
    assert done.returncode == 1 and "under mine:{light}:*" in done.stderr, done.stderr


@pytest.mark.parametrize("broken", ["HA_KEY_PREFIX = (", "raise RuntimeError('no vault')"])
def test_a_project_whose_settings_cannot_be_read_is_an_error_not_the_defaults(
    redis_url, tmp_path, broken
):
    """A settings module that does not import (a syntax error, a secret it reads at import):
    the command used Scrapy's defaults in silence, and said it could not reach a Redis at
    localhost, the project's REDIS_URL never named."""
    (tmp_path / "scrapy.cfg").write_text("[settings]\ndefault = broken_settings\n")
    (tmp_path / "broken_settings.py").write_text(f"REDIS_URL = {redis_url!r}\n{broken}\n")
    done = _run(["status", "light"], tmp_path)
    assert done.returncode == 2, done.stderr
    assert "the project's settings (broken_settings) cannot be read:" in done.stderr
    assert "localhost" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_status_reads_the_same_outside_a_project_and_in_an_empty_one(redis_url, tmp_path):
    dead_letters(redis_url, "light", [("http://a.test/1", "gone", 404)])
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "scrapy.cfg").write_text("[settings]\ndefault = empty_settings\n")
    (tmp_path / "project" / "empty_settings.py").write_text("")
    shown = []
    for where in (tmp_path, tmp_path / "project"):
        done = _run(["--redis-url", redis_url, "status", "light", "--json"], where)
        assert done.returncode == 0, done.stderr
        status = json.loads(done.stdout)
        shown.append({k: status[k] for k in ("spider", "pending", "dead", "fingerprints")})
    assert shown[0] == shown[1] == {"spider": "light", "pending": 0, "dead": 1, "fingerprints": 0}


#: As root, a process that file permissions bind (as any other user's): without the
#: capabilities that let root search any directory.
NOT_ALL_SEEING = (
    ("setpriv", "--bounding-set", "-dac_override,-dac_read_search") if os.geteuid() == 0 else ()
)


@pytest.mark.skipif(
    os.geteuid() == 0 and not shutil.which("setpriv"), reason="root, without setpriv"
)
@pytest.mark.parametrize("where", ["HOME", "XDG_CONFIG_HOME"])
def test_a_home_this_user_cannot_search_is_no_project(redis_url, tmp_path, where):
    """A home (or XDG_CONFIG_HOME) this user may not search (a container run as another
    user than its image's HOME belongs to): Scrapy reads no scrapy.cfg there, nor does the
    command; it ran before Scrapy was put off, and ended in a PermissionError traceback."""
    dead_letters(redis_url, "light", [("http://a.test/1", "gone", 404)])
    locked = tmp_path / "locked"
    (locked / ".config").mkdir(parents=True)
    locked.chmod(0)
    try:
        env = {where: str(locked if where == "HOME" else locked / ".config")}
        done = _run(
            ["--redis-url", redis_url, "dlq", "list", "light"], tmp_path, env, NOT_ALL_SEEING
        )
    finally:
        locked.chmod(0o700)
    assert done.returncode == 0, done.stderr
    assert "1 entry listed (gone 1)" in done.stdout, done.stdout
    assert "SCRAPY False" in done.stderr


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to be a user of no home"
)
def test_a_user_without_a_home_is_outside_any_project(redis_url, tmp_path):
    """A user the system does not list, started with HOME unset (``env -i``, a service
    manager's bare environment): Python cannot say where ``~`` is, and Scrapy reads no
    user's scrapy.cfg; the command ran before Scrapy was put off, and ended in a
    RuntimeError traceback (could not determine home directory)."""
    dead_letters(redis_url, "light", [("http://a.test/1", "gone", 404)])
    uid = next(u for u in range(43210, 44210) if not _listed(u))
    as_nobody = ("setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups")
    keep_reading = ("--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search")
    tmp_path.chmod(0o777)
    run_env = {k: v for k, v in _env().items() if k != "HOME"}
    done = subprocess.run(
        [*as_nobody, *keep_reading, sys.executable, "-c", SCRIPT]
        + ["--redis-url", redis_url, "dlq", "list", "light"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**run_env, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert "1 entry listed (gone 1)" in done.stdout, done.stdout


def _listed(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


VALUES = [
    ("HA_BOOL", "getbool", "false"),
    ("HA_BOOL", "getbool", "1"),
    ("HA_INT", "getint", "7"),
    ("HA_FLOAT", "getfloat", "0.5"),
    ("HA_LIST", "getlist", "a,b"),
    ("HA_LIST", "getlist", ["a"]),
    ("HA_DICT", "getdict", '{"a": 1}'),
    ("REDIS_URL", "get", "redis://x:1/0"),
    ("REDIS_PARAMS", "get", None),
]


@pytest.mark.parametrize(("name", "method", "value"), VALUES)
def test_bare_settings_read_as_scrapys_do(name, method, value):
    bare, full = BareSettings(), Settings()
    for settings in (bare, full):
        if value is not None:
            settings.set(name, value, priority="cmdline")
            settings.set(name, "ignored", priority="project")  # a lower priority: kept
    assert getattr(bare, method)(name) == getattr(full, method)(name)
    assert (name in bare) == (name in full)


def test_bare_settings_answer_other_names_from_scrapys_defaults():
    bare = BareSettings({"REDIS_URL": "redis://x:1/0"})
    assert bare._scrapy is None  # own names alone: Scrapy's Settings not built yet
    assert bare.getint("CONCURRENT_REQUESTS") == Settings().getint("CONCURRENT_REQUESTS")
    assert bare._scrapy is not None  # built for a name of Scrapy's
    assert bare["REDIS_URL"] == "redis://x:1/0"  # kept when Scrapy's settings took over
    bare.set("HA_SHARDS", 4)
    assert bare.getint("HA_SHARDS") == 4 and bare.getpriority("HA_SHARDS") == 20


@pytest.mark.parametrize("command", [["status", "light"], ["push", "light", "http://a.example/"]])
def test_a_command_run_from_a_deleted_directory_says_so(tmp_path: Path, command: list[str]):
    """A shell left in a directory removed since: every command ended in a traceback
    (``FileNotFoundError`` from ``os.getcwd``), or blamed the project's settings."""
    gone = tmp_path / "gone"
    gone.mkdir()
    script = (
        "import os, sys; os.chdir(sys.argv[1]); os.rmdir(sys.argv[1]); "
        "from scrapy_ha.cli import main; sys.exit(main(sys.argv[2:]))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script, str(gone), "--redis-url", "redis://127.0.0.1:1/0", *command],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "scrapy.cfg" not in done.stderr, done.stderr
    assert "working directory" in done.stderr and "no longer exists" in done.stderr, done.stderr
