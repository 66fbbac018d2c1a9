"""Scrapy's own commands in a project that uses scrapy-ha: ``scrapy fetch``, ``parse`` and
``shell`` crawl a request of their own, in this process, and leave the spider's crawl in
Redis alone.

Their request's callback is the command's (not a spider method) and ``fetch`` and
``shell`` put a ``SequenceExclude`` in its meta: scrapy-ha refused to store it (an ERROR),
``fetch`` printed nothing and ``parse`` "No response downloaded", both exiting 0, and
``shell`` waited for ever; and each joined the spider's crawl as a worker: ``fetch
--spider`` during a crawl of 552 pages crawled 342 of them, their 313 items scraped into
nothing, lost to the crawl's feed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING

from scrapy_ha.keys import Keys
from tests.cli_seed import scrapy_ha
from tests.scrapy_project import write_project

if TYPE_CHECKING:
    from pathlib import Path

SPIDERS = """
import scrapy


class One(scrapy.Spider):
    name = "one"

    def parse(self, response):
        yield {"title": "page " + response.url.rsplit("/", 1)[1]}
"""


def scrapy(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``scrapy ARGS`` in *project*, as a user runs it."""
    command = [sys.executable, "-m", "scrapy.cmdline", *args]
    return subprocess.run(
        command, cwd=project, capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )


def test_fetch_parse_and_shell_leave_the_crawl_alone(tmp_path, redis_url, redis_client, site):
    project = write_project(tmp_path, "cmdproj", SPIDERS, f"REDIS_URL = {redis_url!r}\n")
    # the spider's crawl, in Redis: 5 requests waiting for its workers
    pushed = [f"{site.url}/item/{n}" for n in range(1, 6)]
    done = scrapy_ha("push", "one", *pushed, "--create", "--redis-url", redis_url, cwd=project)
    assert done.returncode == 0, done.stderr
    keys = Keys("ha", "one")
    before = redis_client.hgetall(keys.stats)

    fetched = scrapy(project, "fetch", "--spider", "one", f"{site.url}/item/7")
    assert fetched.returncode == 0, fetched.stderr[-3000:]
    assert "Item 7</h1>" in fetched.stdout, fetched.stderr[-3000:]
    assert "command (scrapy.commands.fetch) crawls a request of its own" in fetched.stderr
    assert " ERROR: " not in fetched.stderr, fetched.stderr[-3000:]

    parsed = scrapy(project, "parse", "--spider", "one", "-c", "parse", f"{site.url}/item/8")
    assert parsed.returncode == 0, parsed.stderr[-3000:]
    assert "'title': 'page 8'" in parsed.stdout, parsed.stdout + parsed.stderr[-3000:]
    assert " ERROR: " not in parsed.stderr, parsed.stderr[-3000:]

    code = "response.css('h1::text').get()"
    shell = scrapy(project, "shell", "--spider", "one", f"{site.url}/item/9", "-c", code)
    assert shell.returncode == 0, shell.stderr[-3000:]
    assert shell.stdout.strip() == "Item 9", shell.stdout + shell.stderr[-3000:]
    assert " ERROR: " not in shell.stderr, shell.stderr[-3000:]

    # nothing of the crawl was leased or acked, nothing added: its workers find it as it was
    assert redis_client.hgetall(keys.stats) == before
    assert not any(site.hits().get(url.removeprefix(site.url), 0) for url in pushed)


def test_fetch_and_parse_run_with_checkpoints_on(tmp_path, redis_url, site):
    """``HA_CHECKPOINTS = True``: the checkpoint middleware read the command's request as a
    task of the crawl, and without scrapy-ha's scheduler raised ("HA_CHECKPOINTS needs
    SCHEDULER = 'scrapy_ha.Scheduler'", a traceback): ``fetch`` printed nothing and
    ``parse`` "No response downloaded", both exiting 0. The command's request is no task
    of the crawl: the middleware is off for it."""
    settings = f"REDIS_URL = {redis_url!r}\nHA_CHECKPOINTS = True\n"
    project = write_project(tmp_path, "cmdproj", SPIDERS, settings)

    fetched = scrapy(project, "fetch", "--spider", "one", f"{site.url}/item/7")
    assert fetched.returncode == 0, fetched.stderr[-3000:]
    assert "Item 7</h1>" in fetched.stdout, fetched.stderr[-3000:]
    assert " ERROR: " not in fetched.stderr, fetched.stderr[-3000:]

    parsed = scrapy(project, "parse", "--spider", "one", "-c", "parse", f"{site.url}/item/8")
    assert parsed.returncode == 0, parsed.stderr[-3000:]
    assert "'title': 'page 8'" in parsed.stdout, parsed.stdout + parsed.stderr[-3000:]
    assert " ERROR: " not in parsed.stderr, parsed.stderr[-3000:]


def test_fetch_and_shell_show_a_page_that_is_not_found(tmp_path, redis_url, site):
    """``scrapy fetch`` shows any answer, a 404 too (it asks for every status but
    redirects: a ``SequenceExclude`` in ``handle_httpstatus_list``); scrapy-ha's retry
    middleware read that list by iterating it: "Could not judge the failure ...
    TypeError: 'SequenceExclude' object is not iterable", the page dead-lettered, nothing
    printed, exit code 0."""
    project = write_project(tmp_path, "cmdproj", SPIDERS, f"REDIS_URL = {redis_url!r}\n")
    url = f"{site.url}/no/such/page"

    fetched = scrapy(project, "fetch", "--spider", "one", url)
    assert fetched.returncode == 0, fetched.stderr[-3000:]
    assert fetched.stdout.strip(), fetched.stderr[-3000:]
    assert "downloader/response_status_count/404" in fetched.stderr, fetched.stderr[-3000:]
    assert " ERROR: " not in fetched.stderr, fetched.stderr[-3000:]

    shell = scrapy(project, "shell", "--spider", "one", url, "-c", "response.status")
    assert shell.returncode == 0, shell.stderr[-3000:]
    assert shell.stdout.strip() == "404", shell.stdout + shell.stderr[-3000:]
    assert " ERROR: " not in shell.stderr, shell.stderr[-3000:]
