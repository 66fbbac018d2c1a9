"""The item outbox end to end in a Scrapy project: ``scrapy crawl`` workers with
``HA_ITEMS = "outbox"`` clean items in their own pipelines and commit them with their pages;
``scrapy-ha items SPIDER --to pipelines`` runs the project's storing pipelines on them, with
their classes rebuilt and each entry's id at hand; a sink declared late is told what it
missed."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

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


def test_the_projects_pipelines_store_each_item_once_in_the_consumer(tmp_path, redis_url, site):
    project = _project(tmp_path)
    log = tmp_path / "worker.log"
    worker = crawl(
        project, "books", log, args={"base_url": site.url}, settings={"REDIS_URL": redis_url}
    )
    assert worker.wait(timeout=120) == 0, log.read_text()[-3000:]
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


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)
