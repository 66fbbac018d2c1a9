"""A Scrapy project written into a test's directory, for real ``scrapy crawl`` workers and
``scrapy-ha`` commands run inside it: both read its settings as a user's would."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

#: What every project here has: the add-on, no robots.txt, the remote-control server off.
BASE_SETTINGS = """
BOT_NAME = "{name}"
SPIDER_MODULES = ["{name}.spiders"]
ADDONS = {{"scrapy_ha.Addon": 0}}
ROBOTSTXT_OBEY = False
REMOTE_CONTROL_ENABLED = False
LOG_LEVEL = "INFO"
"""


def write_project(root: Path, name: str, spiders: str, settings: str = "") -> Path:
    """*root* as a project *name*: ``scrapy.cfg``, ``name/settings.py`` (the base settings,
    then *settings*), ``name/spiders/spiders.py`` (*spiders*). Returns *root*."""
    package = root / name
    (package / "spiders").mkdir(parents=True)
    (root / "scrapy.cfg").write_text(f"[settings]\ndefault = {name}.settings\n")
    (package / "__init__.py").write_text("")
    (package / "settings.py").write_text(BASE_SETTINGS.format(name=name) + settings)
    (package / "spiders" / "__init__.py").write_text("")
    (package / "spiders" / "spiders.py").write_text(spiders)
    return root


def crawl(
    project: Path,
    spider: str,
    log: Path,
    *,
    args: dict[str, str] | None = None,
    settings: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """``scrapy crawl SPIDER -a ... -s ...`` in *project*, its output in *log*."""
    command = [sys.executable, "-m", "scrapy.cmdline", "crawl", spider]
    for key, value in (args or {}).items():
        command += ["-a", f"{key}={value}"]
    for key, value in (settings or {}).items():
        command += ["-s", f"{key}={value}"]
    with log.open("wb") as out:
        return subprocess.Popen(
            command,
            cwd=project,
            env={**os.environ, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
