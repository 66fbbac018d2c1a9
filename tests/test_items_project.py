"""The item outbox end to end in a Scrapy project: ``scrapy crawl`` workers with
``HA_ITEMS = "outbox"`` clean items in their own pipelines and commit them with their pages;
``scrapy-ha items SPIDER --to pipelines`` runs the project's storing pipelines on them, with
their classes rebuilt and each entry's id at hand; a sink declared late is told what it
missed."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.runs import end_run, open_run
from scrapy_ha.store.wire import NewEntry
from tests.cli_seed import scrapy_ha
from tests.scrapy_project import crawl, write_project

if TYPE_CHECKING:
    from pathlib import Path

PROJECT = "itemsproj"
SPIDERS = """
import scrapy


class Book(scrapy.Item):
    id = scrapy.Field()
    clean = scrapy.Field()


class Books(scrapy.Spider):
    name = "books"

    def __init__(self, base_url="", **kwargs):
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/list/1"]

    def parse(self, response):
        for href in response.css("a.item::attr(href)").getall():
            yield Book(id=int(href.rsplit("/", 1)[-1]))
        yield from response.follow_all(css="a.next", callback=self.parse)
"""
PIPELINES = """
import json
import os

from scrapy_ha.items import current_entry


class Clean:
    \"\"\"Runs on the workers, before the outbox.\"\"\"

    def process_item(self, item):
        item["clean"] = True
        return item


class Store:
    \"\"\"Runs in the consumer: one line per item, keyed by its stream entry.\"\"\"

    def open_spider(self, spider=None):
        self.fd = os.open(os.environ["STORE_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    def process_item(self, item):
        line = {"entry": current_entry(), "cls": type(item).__name__, **dict(item)}
        os.write(self.fd, (json.dumps(line) + "\\n").encode())
        return item

    def close_spider(self, spider=None):
        os.close(self.fd)


class StoreTo(Store):
    \"\"\"Store, to the file its setting names (``scrapy-ha items ... -s STORE_TO=...``).\"\"\"

    @classmethod
    def from_crawler(cls, crawler):
        pipeline = cls()
        pipeline.path = crawler.settings["STORE_TO"]
        return pipeline

    def open_spider(self, spider=None):
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
"""
SETTINGS = f"""
HA_ITEMS = "outbox"
ITEM_PIPELINES = {{"{PROJECT}.pipelines.Clean": 100}}
HA_ITEMS_PIPELINES = {{"{PROJECT}.pipelines.Store": 100}}
HA_IDLE_TIMEOUT = 1
"""


def _project(tmp_path: Path) -> Path:
    root = write_project(tmp_path / "project", PROJECT, SPIDERS, SETTINGS)
    (root / PROJECT / "pipelines.py").write_text(PIPELINES)
    return root


def _crawled(tmp_path: Path, redis_url: str, site: Any) -> Path:
    """The project, after a worker crawled the site with the outbox (50 items committed)."""
    project = _project(tmp_path)
    log = tmp_path / "worker.log"
    worker = crawl(
        project, "books", log, args={"base_url": site.url}, settings={"REDIS_URL": redis_url}
    )
    assert worker.wait(timeout=120) == 0, log.read_text()[-3000:]
    return project


def test_the_projects_pipelines_store_each_item_once_in_the_consumer(tmp_path, redis_url, site):
    project = _crawled(tmp_path, redis_url, site)
    store = tmp_path / "store.jl"
    run = scrapy_ha(
        "items", "books", "--to", "pipelines", "--exit-idle", "0.5", "--redis-url", redis_url,
        cwd=project, env={**_env(), "STORE_FILE": str(store)},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "consumed 50 item(s)" in run.stdout
    rows = [json.loads(line) for line in store.read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == list(range(1, 51))
    assert {r["cls"] for r in rows} == {"Book"} and all(r["clean"] for r in rows)
    assert len({r["entry"] for r in rows}) == 50
    # a sink declared after the others consumed everything is told what it misses
    late = scrapy_ha(
        "items", "books", "--to", f"jsonl:{tmp_path / 'late.jl'}", "--declare",
        "--redis-url", redis_url, cwd=project,
    )  # fmt: skip
    assert late.returncode == 0, late.stderr
    assert "items it misses: 50" in late.stdout
    assert "declare every sink before the crawl" in late.stderr
    # which items: a sink declared before a new run misses the earlier runs' (walkthrough)
    assert "items of earlier runs of the crawl, or of this run if it started" in late.stderr


def test_the_consumers_pipelines_take_settings_from_the_command_line(tmp_path, redis_url, site):
    """``items --to pipelines`` took no ``-s``: a pipeline that needs a setting the project
    does not hold (the example project's, which needs ``ITEMS_FILE``) could not be used."""
    project = _crawled(tmp_path, redis_url, site)
    store = tmp_path / "store.jl"
    run = scrapy_ha(
        "items", "books", "--to", "pipelines", "--exit-idle", "0.5", "--redis-url", redis_url,
        "-s", f"STORE_TO={store}", "--set",
        f'HA_ITEMS_PIPELINES={{"{PROJECT}.pipelines.StoreTo": 100}}', cwd=project,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert sorted(json.loads(line)["id"] for line in store.read_text().splitlines()) == list(
        range(1, 51)
    )
    bad = scrapy_ha("items", "books", "--to", "pipelines", "-s", "STORE_TO", cwd=project)
    assert bad.returncode == 2
    assert "argument -s/--set: 'STORE_TO' is not NAME=VALUE" in bad.stderr, bad.stderr


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


@deferred_f_from_coro_f
async def test_a_sink_of_a_spider_without_the_outbox_says_its_workers_commit_no_items(
    tmp_path, redis_url
):
    """A QA run: a user who ran the README's ``scrapy-ha items myspider --to
    sqlite:///items.db`` in a project without ``HA_ITEMS = "outbox"`` saw the consumer wait
    for ever, consuming nothing, and nothing said why. It says so, and consumes as before."""
    project = write_project(tmp_path / "project", PROJECT, SPIDERS, "HA_IDLE_TIMEOUT = 1\n")
    await _ended_crawl(redis_url, "books")  # so that --exit-idle exits
    for action in ((), ("--declare",)):
        run = await asyncio.to_thread(
            scrapy_ha, "items", "books", "--to", f"jsonl:{tmp_path / 'items.jl'}",
            "--exit-idle", "0.5", *action, "--redis-url", redis_url, cwd=project,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        said = "note: HA_ITEMS of spider books is 'off' in this project: workers started with"
        assert said in run.stderr, run.stderr
        assert 'set HA_ITEMS = "outbox"' in run.stderr, run.stderr
    outbox = _project(tmp_path / "outbox")
    run = await asyncio.to_thread(
        scrapy_ha, "items", "books", "--to", f"jsonl:{tmp_path / 'o.jl'}", "--exit-idle",
        "0.5", "--redis-url", redis_url, cwd=outbox,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "HA_ITEMS" not in run.stderr, run.stderr


async def _ended_crawl(redis_url: str, spider: str) -> None:
    """A crawl of *spider* whose run began and ended, as a worker leaves it."""
    client = redis.asyncio.Redis.from_url(redis_url)
    queue = RedisQueue(client, Keys("ha", spider))
    await open_run(queue, "worker", 30_000)
    await queue.enqueue([NewEntry(b"fp1", 0, b"payload")])
    (lease,) = await queue.lease(1, 30_000)
    await queue.ack([(lease.id, lease.token)])
    await client.zrem(queue.keys.workers, "worker")  # it left
    assert await end_run(queue)
    await client.aclose()
