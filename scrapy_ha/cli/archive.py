"""``scrapy-ha dlq archive SPIDER``: copy the dead letters not archived yet into the SQL
archive (:mod:`scrapy_ha.deadletters.archive`), and what ``dlq purge`` says of the
entries it keeps for it.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from scrapy_ha.codec.log_masking import one_line
from scrapy_ha.codec.masking import mask_text
from scrapy_ha.config import validate as check
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.deadletters._threads import in_daemon_thread
from scrapy_ha.deadletters.archive import DEFAULT_TABLE, Archive, archive_crawl
from scrapy_ha.ops.shards import dead_letters

if TYPE_CHECKING:
    import argparse

    from scrapy_ha.store.queue import RedisQueue


def _archive_url(args: argparse.Namespace) -> tuple[str, str]:
    """--url, else the archive the spider's workers write to: its settings as they have
    them, the spider's ``custom_settings`` included (a QA run: the project's alone were
    read, so an archive declared there was not found, or another one was)."""
    if args.url:
        return args.url, args.table or DEFAULT_TABLE
    settings = args.worker_view.crawler.settings
    url = check.text(settings, "HA_DLQ_ARCHIVE_URL", "")
    return url, args.table or check.text(settings, "HA_DLQ_ARCHIVE_TABLE", DEFAULT_TABLE)


async def dlq_archive(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Copy the dead letters not archived yet into the SQL archive (--url, or the project's
    HA_DLQ_ARCHIVE_URL); idempotent."""
    url, table = _archive_url(args)
    if not url:
        print(
            "no archive: pass --url (e.g. sqlite:///failed.db) or set HA_DLQ_ARCHIVE_URL in "
            "the project's settings",
            file=sys.stderr,
        )
        return 1
    try:
        archive = Archive(url, table)
    except ConfigError as exc:  # named as the user gave it: the option, or the setting
        said = str(exc)
        if args.url:
            said = said.replace("HA_DLQ_ARCHIVE_URL=", "--url ")
        if args.table:
            said = said.replace("HA_DLQ_ARCHIVE_TABLE=", "--table ")
        raise ConfigError(said) from None
    started = time.monotonic()
    try:
        run = await archive_crawl(dead_letters(queue), archive, dry_run=args.dry_run)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - said plainly, without a traceback
        message = mask_text(f"{type(exc).__name__}: {exc}")
        print(f"error: archive {archive.display_url}: {message}", file=sys.stderr)
        return 2
    finally:  # (a daemon thread: a database frozen under a copy holds no Ctrl-C)
        await in_daemon_thread(archive.close)
    classes = ", ".join(f"{one_line(c)} {n}" for c, n in sorted((run.by_class or {}).items()))
    verb = "would copy" if args.dry_run else "copied"
    print(
        f"{verb} {run.copied} of {run.dead} dead letter(s) of {queue.keys.spider} to "
        f"{archive.display_url} table {archive.table.name}"
        + (f" ({classes})" if classes else "")
        + ("" if args.dry_run else f" in {time.monotonic() - started:.1f}s")
    )
    return _report_errors(run.errors)


#: Refused entries listed by ``dlq archive`` (the rest are counted).
ERRORS_SHOWN = 10


def _report_errors(errors: list[tuple[str, str]]) -> int:
    """Print the entries the database refused (they stay in Redis); 2 if there were any."""
    if not errors:
        return 0
    print(
        f"error: the database refused {len(errors)} dead letter(s); they stay in Redis, "
        f"kept by retention until an archive holds them:",
        file=sys.stderr,
    )
    for entry_id, error in errors[:ERRORS_SHOWN]:
        print(f"  {entry_id}: {error}", file=sys.stderr)
    if len(errors) > ERRORS_SHOWN:
        print(f"  ... and {len(errors) - ERRORS_SHOWN} more", file=sys.stderr)
    return 2


def unarchived_kept(spider: str, n: int, dry_run: bool = False) -> str:
    """What ``dlq purge`` says of the entries it kept (or, a dry run, would keep) because
    they are not archived yet."""
    verb = "would keep" if dry_run else "kept"
    return (
        f"{verb} {n:,} entr{'y' if n == 1 else 'ies'} not archived yet (an SQL archive is "
        f"declared for {spider}): run `scrapy-ha dlq archive {spider}` first, then purge again"
    )
