"""The public surface keeps working: every ``scrapy_ha.…`` name the README and the docs
write, the paths the add-on puts in the settings, the CLI's entry point, and a light
``import scrapy_ha``."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
from scrapy.utils.misc import load_object

from scrapy_ha import addon

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: A dotted name in prose or code: scrapy_ha.retry.RetryMiddleware, scrapy_ha.Scheduler...
NAME = re.compile(r"(?<![\w/.])scrapy_ha(?:\.[A-Za-z_]\w*)+")

#: The names the reference promises, whatever the docs happen to mention.
PROMISED = [
    "scrapy_ha.Scheduler",
    "scrapy_ha.Addon",
    "scrapy_ha.__version__",
    "scrapy_ha.scheduler.Scheduler",
    "scrapy_ha.scheduler.scheduler_for",
    "scrapy_ha.retry.RetryMiddleware",
    "scrapy_ha.retry.ParseErrorMiddleware",
    "scrapy_ha.retry.PermanentError",
    "scrapy_ha.retry.Verdict",
    "scrapy_ha.retry.FailureClass",
    "scrapy_ha.proxy.ProxyMiddleware",
    "scrapy_ha.checkpoint.CheckpointMiddleware",
    "scrapy_ha.checkpoint.task_id",
    "scrapy_ha.cookies.SharedCookiesMiddleware",
    "scrapy_ha.cookies.CookieVersionMiddleware",
    "scrapy_ha.useragent.UserAgentPoolMiddleware",
    "scrapy_ha.parent.ParentLeaseMiddleware",
    "scrapy_ha.spiders.RedisSpider",
    "scrapy_ha.spiders.RedisCrawlSpider",
    "scrapy_ha.dlq.DeadLetterQueue",
    "scrapy_ha.dlq.DeadEntry",
    "scrapy_ha.dlq.parse_entry",
    "scrapy_ha.stats.read_crawl_stats",
    "scrapy_ha.stats.CrawlStats",
    "scrapy_ha.keys.Keys",
    "scrapy_ha.verdict.Verdict",
    "scrapy_ha.verdict.FailureClass",
    "scrapy_ha.codec.encode_request",
    "scrapy_ha.codec.decode_request",
    "scrapy_ha.codec.describe",
    "scrapy_ha.codec.mask_payload",
    "scrapy_ha.codec.mask_url",
    "scrapy_ha.codec.CodecError",
    "scrapy_ha.cli.main",
]


def resolve(name: str) -> object:
    """The object a dotted name names: the longest importable module, then attributes."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:n]))
        except ModuleNotFoundError:
            continue
        for attr in parts[n:]:
            found = getattr(found, attr)
        return found
    raise ModuleNotFoundError(name)


def documented() -> list[str]:
    names = {m for doc in DOCS for m in NAME.findall(doc.read_text())}
    return sorted(names)


def test_the_docs_name_what_the_reference_promises():
    """A test that cannot fail is no test: the scan finds the documented names."""
    names = documented()
    assert {"scrapy_ha.Scheduler", "scrapy_ha.retry.RetryMiddleware"} <= set(names)
    with pytest.raises((ModuleNotFoundError, AttributeError)):
        resolve("scrapy_ha.retry.NoSuchMiddleware")


@pytest.mark.parametrize("name", sorted({*documented(), *PROMISED}))
def test_every_documented_name_resolves(name):
    resolve(name)


def test_the_addon_wires_loadable_components():
    for table in (addon.DOWNLOADER_MIDDLEWARES, addon.SPIDER_MIDDLEWARES):
        for path in table:
            load_object(path)
    assert load_object("scrapy_ha.Scheduler") is resolve("scrapy_ha.scheduler.Scheduler")


def test_the_console_script_is_the_cli():
    """setup.cfg's entry point, ``scrapy_ha.cli:main``, is the function, not a module."""
    main = resolve("scrapy_ha.cli.main")
    assert callable(main) and main.__module__ == "scrapy_ha.cli.cmdline"


def test_importing_the_package_does_not_import_scrapy():
    """``scrapy-ha --version`` and tools that read keys or stats need none of Scrapy's
    engine: the package loads its Scheduler and Addon on first use."""
    code = "import sys, scrapy_ha, scrapy_ha.keys; print('scrapy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
