"""An archive database that is down is said once a minute, not once per dead letter: a
worker copies each batch of dead letters as it makes them, and a busy crawl makes a batch of
one at a time (real redis-server, a PostgreSQL URL whose port takes no connection)."""

from __future__ import annotations

import asyncio
import json
import logging

import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.deadletters.archive import Archive
from scrapy_ha.deadletters.archiver import Archiver
from scrapy_ha.demo.harness import free_port
from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue

KEYS = Keys("ha", "faults")
BATCHES = 6


@deferred_f_from_coro_f
async def test_an_archive_that_is_down_is_said_once_a_minute(redis_client, redis_url, caplog):
    """A QA run: one WARNING (and one connection attempt) per batch, a batch often one dead
    letter: a log flooded while the database was down. The copies are still tried (a
    database back soon archives the next ones) and counted; the WARNINGs that were held
    back are counted in the next one, or at close."""
    for n in range(1, BATCHES + 1):
        redis_client.zadd(KEYS.dead, {str(n): 5000 + n})
        info = {"class": "gone", "reason": "HTTP 404", "status": 404, "first": 1, "last": 2}
        redis_client.hset(KEYS.dead_info, str(n), json.dumps(info))
        redis_client.hset(KEYS.payload, str(n), json.dumps({"v": 1, "u": f"http://x/{n}"}))
    url = f"postgresql+psycopg://scrapy:pw-S3cret@127.0.0.1:{free_port()}/archive"
    stats = get_crawler().stats
    archiver = Archiver(Archive(url), stats)
    queue = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    caplog.set_level(logging.WARNING, logger="scrapy_ha.deadletters.archiver")
    for n in range(1, BATCHES + 1):  # one batch each: each copied on its own
        archiver.submit(queue, [str(n)])
        while (stats.get_value("ha/archive/errors") or 0) < n:
            await asyncio.sleep(0.01)
    await archiver.close()
    await queue.client.aclose()
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 2, said  # the first failure, then what was held back, at close
    assert said[0].startswith("Could not archive 1 dead letter(s) of faults in ")
    assert "5 more dead letter(s) of faults could not be archived" in said[1], said[1]
    assert "scrapy-ha dlq archive faults" in said[1]
    assert "pw-S3cret" not in "\n".join(said)


@deferred_f_from_coro_f
async def test_a_redis_that_fails_is_named_not_the_archive(tmp_path, caplog):
    """A QA run: Redis refused a worker's connections for a while (its ACL password
    changed), and the WARNING said `Could not archive 1 dead letter(s) of qa4 in
    sqlite:///...: ConnectionError: Connection closed by server.`, sending the operator to
    a database that was fine."""
    archive = Archive(f"sqlite:///{tmp_path / 'archive.db'}")
    stats = get_crawler().stats
    archiver = Archiver(archive, stats)
    queue = RedisQueue(redis.asyncio.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0"), KEYS)
    caplog.set_level(logging.WARNING, logger="scrapy_ha.deadletters.archiver")
    archiver.submit(queue, ["1"])
    while not stats.get_value("ha/archive/errors"):
        await asyncio.sleep(0.01)
    await archiver.close()
    await queue.client.aclose()
    archive.close()
    (said,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "Redis failed, not the archive (ConnectionError: " in said, said
