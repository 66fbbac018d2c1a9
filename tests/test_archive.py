"""The SQL archive of dead letters, on SQLite and on a real PostgreSQL, with real crawls."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.deadletters.archive import ARCHIVE_MARK, Archive
from scrapy_ha.deadletters.archiver import Archiver
from scrapy_ha.deadletters.dlq import DeadLetterQueue
from scrapy_ha.demo.harness import free_port
from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from tests.reveal import readable
from tests.spiders import FaultSpider
from tests.test_codec_credentials import LEAKS, EveryCredentialSpider
from tests.test_dlq import PATHS, cli
from tests.test_retry_crawl import FAST_RETRIES

KEYS = Keys("ha", "faults")


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


async def crawl(redis_url: str, site, paths=PATHS, **settings):
    crawler = get_crawler(FaultSpider, {**FAST_RETRIES, "REDIS_URL": redis_url, **settings})
    await crawler.crawl_async(base_url=site.url, paths=paths)
    return crawler


def exported(redis_url: str) -> dict[str, dict]:
    lines = cli(redis_url, "dlq", "export", "faults").stdout.splitlines()
    return {e["id"]: e for e in map(json.loads, lines)}


def rows(url: str) -> dict[str, dict]:
    archive = Archive(url)
    try:
        return {r["entry_id"]: r for r in archive.rows("faults")}
    finally:
        archive.close()


def assert_rows_match(found: dict[str, dict], dlq: dict[str, dict]) -> None:
    assert set(found) == set(dlq)
    for entry_id, e in dlq.items():
        r = found[entry_id]
        assert (r["url"], r["method"], r["failure_class"], r["reason"], r["attempts"]) == (
            e["url"],
            e["method"],
            e["class"],
            e["reason"],
            e["attempts"],
        )
        assert r["status"] == e["status"]
        assert r["history"] == e["history"]
        assert json.loads(r["payload"])["u"] == e["url"]  # the stored request
        assert r["first_failure"] <= r["last_failure"] <= r["archived_at"]


@deferred_f_from_coro_f
async def test_dlq_archive_copies_every_dead_letter_once(
    redis_url, redis_client, site, archive_url
):
    await crawl(redis_url, site)
    dlq = exported(redis_url)
    assert len(dlq) == 3

    dry = cli(redis_url, "dlq", "archive", "faults", "--url", archive_url, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("would copy 3 of 3 dead letter(s) of faults")
    assert not redis_client.hexists(KEYS.dead_archived, ARCHIVE_MARK)  # nothing declared

    first = cli(redis_url, "dlq", "archive", "faults", "--url", archive_url)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("copied 3 of 3 dead letter(s) of faults")
    assert "(gone 2, server 1)" in first.stdout
    archived = rows(archive_url)
    assert_rows_match(archived, dlq)
    assert "pw" not in redis_client.hget(KEYS.dead_archived, ARCHIVE_MARK).decode()

    again = cli(redis_url, "dlq", "archive", "faults", "--url", archive_url)
    assert again.stdout.startswith("copied 0 of 3 dead letter(s)")
    assert rows(archive_url) == archived  # the same rows, none added or rewritten

    # a requeued entry that dies again is a new version: copied again, over its row
    retried = next(i for i, e in dlq.items() if e["class"] == "server")
    assert cli(redis_url, "dlq", "requeue", "faults", retried, "--yes").returncode == 0
    await crawl(redis_url, site, paths=())
    third = cli(redis_url, "dlq", "archive", "faults", "--url", archive_url)
    assert third.stdout.startswith("copied 1 of 3 dead letter(s)")
    after = rows(archive_url)
    assert len(after) == 3 and after[retried]["last_failure"] > archived[retried]["last_failure"]


@deferred_f_from_coro_f
async def test_workers_archive_as_they_dead_letter(redis_url, redis_client, site, archive_url):
    crawler = await crawl(redis_url, site, HA_DLQ_ARCHIVE_URL=archive_url)
    assert crawler.stats.get_value("ha/archive/archived") == 3
    assert crawler.stats.get_value("ha/archive/errors") is None
    assert_rows_match(rows(archive_url), exported(redis_url))
    # the command finds nothing left to copy
    done = cli(redis_url, "dlq", "archive", "faults", "--url", archive_url)
    assert done.stdout.startswith("copied 0 of 3")


def same_database_spelled_otherwise(url: str) -> str:
    """*url* as another user would write it: other credentials and connection options for
    PostgreSQL, another path to the same file for SQLite."""
    if url.startswith("sqlite:///"):
        folder, name = url.removeprefix("sqlite:///").rsplit("/", 1)
        return f"sqlite:///{folder}/./{name}"
    scheme, rest = url.split("://postgres@", 1)
    return f"{scheme}://postgres:other-pw@{rest}?application_name=second&sslmode=disable"


@deferred_f_from_coro_f
async def test_a_second_archive_gets_every_dead_letter_the_first_one_holds(
    redis_url, redis_client, site, archive_url, second_archive_url
):
    """What one archive holds is recorded for that archive: copying to another database
    copies everything again, and each copies only what it lacks."""
    crawler = await crawl(redis_url, site, HA_DLQ_ARCHIVE_URL=archive_url)
    assert crawler.stats.get_value("ha/archive/archived") == 3  # the workers' archive
    dlq = exported(redis_url)

    second = cli(redis_url, "dlq", "archive", "faults", "--url", second_archive_url)
    assert second.returncode == 0, second.stderr
    assert second.stdout.startswith("copied 3 of 3 dead letter(s) of faults"), second.stdout
    assert_rows_match(rows(second_archive_url), dlq)

    for url in (
        archive_url,
        second_archive_url,
        same_database_spelled_otherwise(second_archive_url),
    ):
        again = cli(redis_url, "dlq", "archive", "faults", "--url", url)
        assert again.stdout.startswith("copied 0 of 3 dead letter(s)"), (url, again.stdout)
    other_table = cli(redis_url, "dlq", "archive", "faults", "--url", archive_url, "--table", "t2")
    assert other_table.stdout.startswith("copied 3 of 3 dead letter(s)")  # another sink

    marks = {k.decode(): v.decode() for k, v in redis_client.hgetall(KEYS.dead_archived).items()}
    sinks = {k: v for k, v in marks.items() if k.startswith("~sink:")}
    assert len(sinks) == 3 and not any("pw" in v for v in sinks.values())
    ids = {k.removeprefix("~sink:") for k in sinks}
    for entry_id in dlq:
        at, *held = marks[entry_id].split()
        assert set(held) == ids and int(at) == dlq[entry_id]["dead_at"]


@deferred_f_from_coro_f
async def test_a_database_down_costs_no_request_and_retention_keeps_unarchived_entries(
    redis_url, redis_client, site, tmp_path
):
    down = f"sqlite:///{tmp_path / 'no-such-dir' / 'failed.db'}"  # cannot be opened
    paths = tuple(f"/status/404?n={i}" for i in range(5)) + ("/item/1",)
    crawler = await crawl(
        redis_url, site, paths=paths, HA_DLQ_ARCHIVE_URL=down, HA_DLQ_MAX_ENTRIES=2
    )
    assert crawler.stats.get_value("item_scraped_count") == 1  # the crawl went on
    assert crawler.stats.get_value("ha/dead/gone") == 5
    assert crawler.stats.get_value("ha/archive/errors") >= 1
    assert crawler.stats.get_value("ha/archive/archived") is None
    assert sorted(crawler.spider.errors) == [p for p in paths if "404" in p]
    # retention (2 entries) would have dropped 3: none was archived, all 5 stay
    assert redis_client.zcard(KEYS.dead) == 5

    # purge keeps what is not archived, and says so (its dry run too)
    dry = cli(redis_url, "dlq", "purge", "faults", "--all", "--dry-run").stdout.splitlines()
    # (what it would purge and keep, as the purge does: a QA run's said "would purge 5")
    assert dry[0] == "would purge 0 entries of faults (dry run: nothing changed)"
    assert dry[-1] == (
        "would keep 5 entries not archived yet (an SQL archive is declared for faults): run "
        "`scrapy-ha dlq archive faults` first, then purge again"
    )
    purge = cli(redis_url, "dlq", "purge", "faults", "--all", "--yes")
    assert purge.stdout.splitlines() == [
        "purged 0 of 5 entries",
        "kept 5 entries not archived yet (an SQL archive is declared for faults): run "
        "`scrapy-ha dlq archive faults` first, then purge again",
    ]
    assert redis_client.zcard(KEYS.dead) == 5

    # the command catches up; then retention drops archived entries again
    good = f"sqlite:///{tmp_path / 'failed.db'}"
    assert cli(redis_url, "dlq", "archive", "faults", "--url", good).stdout.startswith(
        "copied 5 of 5"
    )
    await crawl(
        redis_url, site, paths=("/status/410",), HA_DLQ_ARCHIVE_URL=good, HA_DLQ_MAX_ENTRIES=2
    )
    assert len(rows(good)) == 6  # the new one archived by the worker
    # trimmed down to the limit as the new one arrived (it was not archived yet then)
    assert redis_client.zcard(KEYS.dead) <= 2
    assert redis_client.zcard(KEYS.dead) == len(exported(redis_url))
    purge = cli(redis_url, "dlq", "purge", "faults", "--all", "--yes")
    assert purge.stdout.startswith("purged ") and "kept" not in purge.stdout
    assert redis_client.zcard(KEYS.dead) == 0
    # no entry's mark is left: the declaration and the two sinks' names are
    fields = sorted(f.decode() for f in redis_client.hkeys(KEYS.dead_archived))
    assert fields[0] == ARCHIVE_MARK and all(f.startswith("~sink:") for f in fields[1:])


def test_a_bad_archive_url_is_named(redis_url, redis_client):
    redis_client.hset("ha:{faults}:stats", "enqueued", 1)  # the crawl is there
    result = cli(redis_url, "dlq", "archive", "faults", "--url", "nosuchdb://u:secret@h/x")
    assert result.returncode == 2
    assert "error: --url 'nosuchdb://u:***@h/x'" in result.stderr
    assert "secret" not in result.stderr


#: URLs SQLAlchemy cannot read as the user meant them: a port that is not a number (a
#: traceback, the setting unnamed), a password with an unencoded '@' (part of the password
#: read as the host, and shown by the driver's error when it could not resolve it)
MISREAD = [
    ("postgresql+psycopg://u:secret@127.0.0.1:notaport/db", "its port is not a number"),
    ("postgresql+psycopg://u:sec@ret@127.0.0.1/db", "percent-encode '@' in a password"),
    # a generated password's '/' with a port mistyped: the error showed the password
    ("postgresql+psycopg://u:sec/ret@127.0.0.1:543a/db", "its port is not a number"),
]


@pytest.mark.parametrize(("url", "said"), MISREAD)
def test_an_archive_url_read_otherwise_is_named(redis_url, redis_client, url, said):
    redis_client.hset("ha:{faults}:stats", "enqueued", 1)  # the crawl is there
    result = cli(redis_url, "dlq", "archive", "faults", "--url", url)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: --url 'postgresql+psycopg://u:***@")
    assert said in result.stderr and "Traceback" not in result.stderr
    assert "secret" not in result.stderr and "ret@" not in result.stderr


@pytest.mark.parametrize(("url", "said"), MISREAD)
@deferred_f_from_coro_f
async def test_a_worker_with_an_archive_url_read_otherwise_does_not_start(
    redis_url, site, caplog, url, said
):
    crawler = await crawl(redis_url, site, HA_DLQ_ARCHIVE_URL=url)
    assert crawler.stats.get_value("response_received_count") is None
    assert "scrapy-ha cannot start: HA_DLQ_ARCHIVE_URL='postgresql+psycopg://u:***@" in caplog.text
    assert said in caplog.text
    assert "secret" not in caplog.text and "ret@" not in caplog.text


@deferred_f_from_coro_f
async def test_a_worker_with_a_bad_archive_url_does_not_start(redis_url, site, caplog):
    crawler = await crawl(redis_url, site, HA_DLQ_ARCHIVE_URL="nosuchdb://u:secret@h/x")
    assert crawler.stats.get_value("response_received_count") is None
    assert "scrapy-ha cannot start: HA_DLQ_ARCHIVE_URL='nosuchdb://u:***@h/x'" in caplog.text
    assert "secret" not in caplog.text


@deferred_f_from_coro_f
async def test_a_worker_with_an_archive_in_memory_does_not_start(redis_url, site, caplog):
    """It archived into a database gone with the worker, and a purge then dropped the dead
    letters it had marked archived there."""
    crawler = await crawl(redis_url, site, HA_DLQ_ARCHIVE_URL="sqlite://")
    assert crawler.stats.get_value("response_received_count") is None
    assert (
        "scrapy-ha cannot start: HA_DLQ_ARCHIVE_URL='sqlite://': a SQLite database in memory"
        in caplog.text
    )


@deferred_f_from_coro_f
async def test_a_password_in_the_archive_urls_query_string_is_never_stored_nor_logged(
    redis_url, redis_client, site, caplog
):
    # libpq takes the password from the query string too; nothing listens on that port
    url = f"postgresql+psycopg://crawler@127.0.0.1:{free_port()}/db?password=arch-S1"
    caplog.set_level(logging.INFO, logger="scrapy_ha")
    crawler = await crawl(redis_url, site, HA_DLQ_ARCHIVE_URL=url)
    assert crawler.stats.get_value("ha/archive/errors") >= 1
    declared = redis_client.hget(KEYS.dead_archived, ARCHIVE_MARK).decode()
    assert declared == url.replace("arch-S1", "***")
    assert "are archived in postgresql+psycopg://crawler@127.0.0.1" in caplog.text
    assert "Could not archive" in caplog.text
    assert "arch-S1" not in caplog.text
    assert Archive(url).display_url == declared


@deferred_f_from_coro_f
async def test_the_archive_keeps_what_every_display_masks(
    redis_url, site, proxy_factory, archive_url
):
    proxy = proxy_factory().url.replace("http://", "http://bob:proxy-S4@")
    crawler = get_crawler(EveryCredentialSpider, {**FAST_RETRIES, "REDIS_URL": redis_url})
    await crawler.crawl_async(base_url=site.url, proxy=proxy)
    assert cli(redis_url, "dlq", "archive", "allcreds", "--url", archive_url).returncode == 0
    archive = Archive(archive_url)
    try:
        (row,) = archive.rows("allcreds")
    finally:
        archive.close()
    shown = readable(json.dumps(row, default=str))  # header bytes decoded: none hides there
    leaked = [s for s in LEAKS if s in shown]
    assert not leaked, f"the archive keeps {leaked}"
    payload = json.loads(row["payload"])
    assert payload["h"]["Authorization"] == "***" and payload["c"] == {"jar": "***"}
    assert payload["mt"]["http_pass"] == "***" and payload["mt"]["http_user"] == "alice"
    assert row["url"].endswith("?api_key=***&page=2") and payload["u"] == row["url"]


@deferred_f_from_coro_f
async def test_a_dead_letter_archived_again_counts_once(redis_client, redis_url, archive_url):
    """The same dead letters submitted again (a retry, or a copy made again after a kill
    before its mark) are upserted over their rows: ``ha/archive/archived`` counts the
    records newly stored, each once."""
    for entry_id in ("1", "2", "3"):
        redis_client.zadd(KEYS.dead, {entry_id: 5000 + int(entry_id)})
        info = {"class": "gone", "reason": "HTTP 404", "status": 404, "first": 1, "last": 2}
        redis_client.hset(KEYS.dead_info, entry_id, json.dumps(info))
        redis_client.hset(KEYS.payload, entry_id, json.dumps({"v": 1, "u": f"http://x/{entry_id}"}))
    stats = get_crawler().stats
    archiver = Archiver(Archive(archive_url), stats)
    queue = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    archiver.submit(queue, ["1", "2", "3"])
    archiver.submit(queue, ["2", "3"])  # again, before the first copy is done
    await archiver.close()  # waits for the copies
    assert stats.get_value("ha/archive/errors") is None
    assert stats.get_value("ha/archive/archived") == 3
    assert sorted(rows(archive_url)) == ["1", "2", "3"]
    # a copy made again (the worker killed before its mark): one record, already stored
    archive = Archive(archive_url)
    try:
        entries = await DeadLetterQueue(queue).entries()
        again = await asyncio.to_thread(archive.write, "faults", entries)
    finally:
        archive.close()
    assert (len(again.entries), again.new) == (3, 0)
    await queue.client.aclose()
