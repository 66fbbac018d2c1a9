"""The SQL archive of a sharded crawl (``HA_SHARDS > 1``): every shard's dead letters, by the
workers as they make them and by ``scrapy-ha dlq archive``; each shard's retention and
``dlq purge`` keep what no archive holds."""

from __future__ import annotations

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.deadletters.archive import ARCHIVE_MARK
from scrapy_ha.keys import Keys
from tests.test_archive import crawl, exported, rows
from tests.test_dlq import cli

#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")

SHARDS = Keys("ha", "faults", 0, 3).every_shard()
PATHS = tuple(f"/status/404?n={i}" for i in range(24))


def per_shard(redis_client) -> list[int]:
    return [redis_client.zcard(k.dead) for k in SHARDS]


@deferred_f_from_coro_f
async def test_workers_archive_every_shard_s_dead_letters(
    redis_url, redis_client, site, archive_url
):
    """Refused at start before: the worker read shard 0's dead letters alone."""
    crawler = await crawl(redis_url, site, PATHS, HA_SHARDS=3, HA_DLQ_ARCHIVE_URL=archive_url)
    assert sum(per_shard(redis_client)) == 24
    dlq = exported(redis_url)  # ids as the crawl names them: "<shard>:<id>" past shard 0
    assert len(dlq) == 24 and any(":" in i for i in dlq)
    assert set(rows(archive_url)) == set(dlq)
    assert crawler.stats.get_value("ha/archive/archived") == 24
    assert all(redis_client.hexists(k.dead_archived, ARCHIVE_MARK) for k in SHARDS)
    again = cli(redis_url, "dlq", "archive", "faults", "--url", archive_url)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("copied 0 of 24 dead letter(s) of faults")
    purged = cli(redis_url, "dlq", "purge", "faults", "--all", "--yes")
    assert purged.returncode == 0, purged.stderr
    assert sum(per_shard(redis_client)) == 0  # every one archived: every one purged


@deferred_f_from_coro_f
async def test_dlq_archive_copies_every_shard_and_purge_keeps_the_rest(
    redis_url, redis_client, site, archive_url
):
    """The command refused a sharded crawl; declared, each shard's purge keeps what no
    archive holds (those dead-lettered after the copy)."""
    await crawl(redis_url, site, PATHS, HA_SHARDS=3)
    dry = cli(redis_url, "dlq", "archive", "faults", "--url", archive_url, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("would copy 24 of 24 dead letter(s) of faults")
    first = cli(redis_url, "dlq", "archive", "faults", "--url", archive_url)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("copied 24 of 24 dead letter(s) of faults")
    dlq = exported(redis_url)
    found = rows(archive_url)
    assert set(found) == set(dlq)
    assert all(found[i]["url"] == e["url"] for i, e in dlq.items())

    later = tuple(f"/status/410?n={i}" for i in range(9))
    await crawl(redis_url, site, later, HA_SHARDS=3)  # no archive setting: not copied
    purged = cli(redis_url, "dlq", "purge", "faults", "--all", "--yes")
    assert purged.returncode == 0, purged.stderr
    assert "kept 9 entries not archived yet" in purged.stdout + purged.stderr
    assert sum(per_shard(redis_client)) == 9
    last = cli(redis_url, "dlq", "archive", "faults", "--url", archive_url)
    assert last.stdout.startswith("copied 9 of 9 dead letter(s)"), last.stdout
    assert len(rows(archive_url)) == 33


@deferred_f_from_coro_f
async def test_a_crawl_grown_to_more_shards_keeps_in_the_new_ones_what_no_archive_holds(
    redis_url, redis_client, site, archive_url
):
    """The archive was declared in each shard the crawl had: a finished crawl of 2 shards
    run again with 3 had none in shard 2, whose purge (and retention) dropped for good the
    dead letters no archive held."""
    first = tuple(f"/status/404?n={i}" for i in range(6))
    await crawl(
        redis_url, site, first, HA_SHARDS=2, HA_DLQ_ARCHIVE_URL=archive_url, SCHEDULER_PERSIST=False
    )
    later = tuple(f"/status/410?n={i}" for i in range(30))  # no archive setting: not copied
    await crawl(redis_url, site, later, HA_SHARDS=3, SCHEDULER_PERSIST=False)
    assert redis_client.get("ha:{faults}:shards") == b"3"
    assert min(per_shard(redis_client)) > 0  # (shard 2 holds some)
    purged = cli(redis_url, "dlq", "purge", "faults", "--all", "--yes")
    assert purged.returncode == 0, purged.stderr
    assert "kept 30 entries not archived yet" in purged.stdout + purged.stderr
    assert sum(per_shard(redis_client)) == 30


@deferred_f_from_coro_f
async def test_a_crawl_sharded_after_one_shard_keeps_its_archive_declared(
    redis_url, redis_client, site, archive_url
):
    """A finished crawl of one shard run again sharded: the worker that took it over
    deleted what the finished run kept under its tag, the archive's declaration with the
    counters, so the shards' purge dropped for good what no archive held."""
    first = tuple(f"/status/404?n={i}" for i in range(6))
    await crawl(redis_url, site, first, HA_DLQ_ARCHIVE_URL=archive_url, SCHEDULER_PERSIST=False)
    assert cli(redis_url, "dlq", "purge", "faults", "--all", "--yes").returncode == 0
    later = tuple(f"/status/410?n={i}" for i in range(30))  # no archive setting: not copied
    await crawl(redis_url, site, later, HA_SHARDS=3, SCHEDULER_PERSIST=False)
    assert redis_client.get("ha:{faults}:shards") == b"3"
    purged = cli(redis_url, "dlq", "purge", "faults", "--all", "--yes")
    assert purged.returncode == 0, purged.stderr
    assert "kept 30 entries not archived yet" in purged.stdout + purged.stderr
    assert sum(per_shard(redis_client)) == 30
