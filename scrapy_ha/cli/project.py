"""What a worker of a spider reads, read for ``scrapy-ha``: its settings and fingerprinter.

A worker's settings are the project's (``scrapy.cfg`` or ``SCRAPY_SETTINGS_MODULE``), then
its spider's ``custom_settings``, then what its add-ons set; its request fingerprinter is
``REQUEST_FINGERPRINTER_CLASS`` built from them. :func:`worker_view` builds the same (a
Scrapy ``Crawler`` without an engine, a reactor or extensions), so that every command finds
``HA_KEY_PREFIX``, ``HA_SHARDS`` and ``REDIS_URL`` where a worker finds them, and ``push``
gives a request the fingerprint, the shard and the stored form a worker would give it
(:class:`~scrapy_ha.scheduler.admission.Admission`, the worker's own code, does that).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.settings import Settings

#: The commands (modules of :mod:`scrapy_ha.cli`) that read no more of a project than its
#: settings: no request built or fingerprinted, no spider, no pipeline. Outside any
#: project they run without importing Scrapy (:mod:`scrapy_ha.config.bare`).
SETTINGS_ONLY = frozenset(
    ("checkpoints", "delayed", "dlq", "flush", "gates", "pause", "report", "status", "stop")
    + ("workers",)
)


@dataclass(frozen=True)
class WorkerView:
    """A spider's settings and fingerprinter as its workers have them."""

    #: settings, add-ons applied, ``request_fingerprinter`` built; no engine
    crawler: Crawler
    #: the spider as the codec reads it: its class's attributes, ``crawler`` set
    spider: Spider
    #: why these are not all a worker's settings ("" when they are): no project here, or
    #: no such spider in it
    caveat: str = ""


def worker_view(settings: Settings, name: str) -> WorkerView:
    """The settings and fingerprinter a worker of spider *name* has, from the project's
    *settings* (those of the directory the command runs in)."""
    from scrapy.crawler import Crawler
    from scrapy.utils.misc import build_from_crawler, load_object

    spidercls, caveat = _spider_class(settings, name)
    crawler = Crawler(spidercls, settings)  # the spider's custom_settings
    crawler.addons.load_settings(crawler.settings)
    fingerprinter = load_object(crawler.settings["REQUEST_FINGERPRINTER_CLASS"])
    crawler.request_fingerprinter = build_from_crawler(fingerprinter, crawler)
    return WorkerView(crawler, _spider(spidercls, name, crawler), caveat)


def settings_only(args: argparse.Namespace) -> bool:
    """Whether command *args* reads only settings Scrapy has no default for: one of
    :data:`SETTINGS_ONLY`, run where Scrapy finds no project (no ``SCRAPY_SETTINGS_MODULE``,
    no ``scrapy.cfg`` here or above, nor a user's or the system's, which may name one)."""
    module = getattr(args.func, "module", "").rpartition(".")[2]
    if module not in SETTINGS_ONLY or os.environ.get("SCRAPY_SETTINGS_MODULE"):
        return False
    here = Path.cwd().resolve()
    found = [folder / "scrapy.cfg" for folder in (here, *here.parents)]
    found += [Path("/etc/scrapy.cfg"), Path(r"c:\scrapy\scrapy.cfg")]  # (Windows' own)
    with contextlib.suppress(RuntimeError):  # no home (a user the system does not list)
        config_home = Path(os.environ.get("XDG_CONFIG_HOME") or Path("~/.config").expanduser())
        found += [config_home / "scrapy.cfg", Path("~/.scrapy.cfg").expanduser()]
    return not any(_there(path) for path in found)  # (scrapy.utils.conf.get_sources)


def _there(path: Path) -> bool:
    """Whether *path* exists; not when it cannot be looked at (a home this user may not
    search), which Scrapy's reading of its configuration skips as well."""
    try:
        return path.exists()
    except OSError:
        return False


def _spider_class(settings: Settings, name: str) -> tuple[type[Spider], str]:
    from scrapy import Spider
    from scrapy.spiderloader import get_spider_loader
    from scrapy.utils.project import inside_project

    if not inside_project():
        return Spider, (
            "not in a Scrapy project: request fingerprints, shards and the stored form "
            "follow Scrapy's defaults, which may not be the workers' (run scrapy-ha in the "
            "project's directory, or set SCRAPY_SETTINGS_MODULE)"
        )
    try:
        return get_spider_loader(settings).load(name), ""
    except KeyError:
        return Spider, (
            f"the project has no spider {name!r}: its settings are used without a spider's "
            f"custom_settings"
        )
    except Exception as exc:  # noqa: BLE001 - a spider module that fails to import
        return Spider, (
            f"the project's spiders cannot be loaded ({type(exc).__name__}: {exc}): its "
            f"settings are used without spider {name!r}'s custom_settings"
        )


def _spider(spidercls: type[Spider], name: str, crawler: Crawler) -> Spider:
    """An instance of *spidercls* whose ``__init__`` did not run: a worker's ``-a``
    arguments are not the command's, and building a spider may open connections. The
    codec reads its class's attributes (``http_user``...) and ``crawler.settings``."""
    from scrapy import Spider

    spider = spidercls.__new__(spidercls)
    Spider.__init__(spider, name=name)
    spider.crawler = crawler
    spider.settings = crawler.settings
    return spider
