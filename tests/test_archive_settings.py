"""``scrapy-ha dlq archive SPIDER`` finds the archive where the spider's workers find it:
the project's settings, then the spider's ``custom_settings`` (a QA run: only the
project's were read, so an archive a spider declared was "no archive", or a project-wide
one was written to instead). A real project, a real redis-server, SQLite archives."""

from __future__ import annotations

import sqlite3
import subprocess
from typing import TYPE_CHECKING

import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.deadletters.archive import DEFAULT_TABLE as TABLE
from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry
from tests.cli_seed import SCRAPY_HA
from tests.scrapy_project import write_project

if TYPE_CHECKING:
    from pathlib import Path

SPIDERS = """
import scrapy


class Declares(scrapy.Spider):
    name = "declares"
    custom_settings = {{"HA_DLQ_ARCHIVE_URL": "sqlite:///{own}"}}
"""


async def _one_dead_letter(redis_url: str) -> None:
    queue = RedisQueue(redis.asyncio.Redis.from_url(redis_url), Keys("ha", "declares"))
    await queue.client.delete(*queue.keys.all())
    await queue.enqueue([NewEntry(b"fp", 0, b'{"v":1,"u":"http://a.test/gone"}')])
    (lease,) = await queue.lease(1, 60_000)
    assert await queue.dead_letter(lease.id, lease.token, {"class": "gone", "reason": "410"})
    await queue.client.aclose()


def _rows(path: Path) -> int:
    if not path.exists():
        return 0
    with sqlite3.connect(path) as db:
        if not db.execute("select name from sqlite_master where name = ?", [TABLE]).fetchone():
            return 0
        return int(db.execute(f"select count(*) from {TABLE}").fetchone()[0])  # noqa: S608


@deferred_f_from_coro_f
async def test_dlq_archive_copies_into_the_archive_the_spider_declares(redis_url, tmp_path: Path):
    own, project_wide = tmp_path / "own.db", tmp_path / "project.db"
    project = write_project(
        tmp_path / "project",
        "arch",
        SPIDERS.format(own=own),
        f'HA_DLQ_ARCHIVE_URL = "sqlite:///{project_wide}"\n',
    )
    await _one_dead_letter(redis_url)
    done = subprocess.run(
        [SCRAPY_HA, "--redis-url", redis_url, "dlq", "archive", "declares"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert _rows(own) == 1 and _rows(project_wide) == 0, done.stdout
