"""A permanent SQL archive of dead letters (``HA_DLQ_ARCHIVE_URL``), written with SQLAlchemy.

Redis keeps the dead-letter queue within its retention (``HA_DLQ_MAX_ENTRIES``,
``HA_DLQ_MAX_AGE``); an archive keeps every dead letter for good, in one table that any SQL
tool can query. ``scrapy-ha dlq archive SPIDER`` copies the entries not archived yet, and
workers whose settings name an archive copy each dead letter as they make it, in a thread of
their own: a database that is down costs no request (the error is logged and counted as
``ha/archive/errors``, and the command catches up later).

The archive is the permanent record, not the replay source (Redis is): each row is masked
as every display masks a dead letter (:mod:`scrapy_ha.codec.masking`), the stored request in
``payload`` included (secret headers, cookies, secret query parameters, the secret fields of
a form or JSON body, ``meta["http_pass"]`` read ``***``).

Which entries each archive holds is kept in Redis, per archive (:mod:`.marks`): copying
to a second database copies everything it lacks, and once an archive is declared for a
crawl, retention and ``dlq purge`` drop only entries some archive holds, so nothing leaves
Redis unrecorded.
"""

from __future__ import annotations

__all__ = [
    "ARCHIVE_MARK",
    "DEFAULT_TABLE",
    "SINK_MARK",
    "Archive",
    "ArchiveRun",
    "Written",
    "archive_crawl",
    "declare",
    "row",
    "sink_id",
    "unarchived",
]

import logging
import re
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from scrapy_ha.codec.masking import mask_text, mask_url
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.deadletters._threads import in_daemon_thread
from scrapy_ha.deadletters.marks import (
    ARCHIVE_MARK,
    SINK_MARK,
    declare,
    durable_url,
    forget_gone,
    mark,
    parts,
    sink_id,
    sink_name,
    unarchived,
)
from scrapy_ha.deadletters.rows import row

if TYPE_CHECKING:
    import sqlalchemy

    from scrapy_ha.deadletters.dlq import DeadEntry, DeadLetterQueue

logger = logging.getLogger(__name__)

#: The table's default name: prefixed so that it sits next to an application's own tables.
DEFAULT_TABLE = "scrapy_ha_dead_letters"
#: Seconds a database has to accept a connection: past this it counts as down.
CONNECT_TIMEOUT = 10
#: A table name: letters, digits and underscores (it is written into SQL as an identifier).
TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def _sqlalchemy() -> Any:
    try:
        import sqlalchemy
    except ImportError:
        raise ConfigError(
            "HA_DLQ_ARCHIVE_URL needs SQLAlchemy: pip install sqlalchemy (psycopg for PostgreSQL)"
        ) from None
    return sqlalchemy


def _table(sa: Any, name: str) -> sqlalchemy.Table:
    if not TABLE_NAME.match(name):
        raise ConfigError(
            f"HA_DLQ_ARCHIVE_TABLE={name!r}: use letters, digits and underscores "
            f"(default {DEFAULT_TABLE})"
        )
    when = sa.DateTime(timezone=True)
    table: sqlalchemy.Table = sa.Table(
        name,
        sa.MetaData(),
        sa.Column("spider", sa.String(200), primary_key=True),
        sa.Column("entry_id", sa.String(64), primary_key=True),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("method", sa.String(16), nullable=False),
        sa.Column("failure_class", sa.String(64), nullable=False, index=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("status", sa.Integer),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("history", sa.JSON, nullable=False),
        sa.Column("first_failure", when, nullable=False),
        sa.Column("last_failure", when, nullable=False, index=True),
        sa.Column("payload", sa.Text),
        sa.Column("archived_at", when, nullable=False),
    )
    return table


class Archive:
    """The archive table in the database at *url*; blocking calls (run them in a thread)."""

    def __init__(self, url: str, table: str = DEFAULT_TABLE) -> None:
        sa = _sqlalchemy()
        self._sa = sa
        self.url = url
        try:
            url = durable_url(sa, url, f"HA_DLQ_ARCHIVE_URL={mask_url(url)!r}")
            self.url = url
            self.display_url = mask_url(url)  # a password in the query string too (libpq)
            self.engine: sqlalchemy.Engine = sa.create_engine(
                url, connect_args=connect_args(url), pool_pre_ping=True
            )
        except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, ImportError) as exc:
            raise ConfigError(
                f"HA_DLQ_ARCHIVE_URL={mask_url(url)!r}: {mask_text(str(exc))} (a SQLAlchemy "
                f"URL such as "
                f"sqlite:///failed.db or postgresql+psycopg://user:pw@host/db)"
            ) from None
        self.table = _table(sa, table)
        #: the database and table, without credentials (see :func:`sink_id`)
        self.sink_name = sink_name(sa.engine.make_url(url), table)
        self.sink = sink_id(self.sink_name)

    def create(self) -> None:
        """Create the table if it is not there."""
        self.table.metadata.create_all(self.engine)

    def write(self, spider: str, entries: list[DeadEntry]) -> Written:
        """Insert or update (by spider and entry id) the rows of *entries*, in one
        transaction; when the database refuses that batch for its data (not for its
        connection), each row in a transaction of its own, so that one row it refuses costs
        that entry alone. Returns the entries written, how many of them are new rows, and
        the errors of the others."""
        done = Written([], [])
        if not entries:
            return done
        now = datetime.now(UTC)
        rows = [row(spider, e, now) for e in entries]
        try:
            done.new = self._upsert(spider, rows)
            done.entries += entries
            return done
        except self._sa.exc.SQLAlchemyError as exc:
            if _connection_error(self._sa, exc) or len(rows) == 1:
                raise
        for entry, one in zip(entries, rows, strict=True):
            try:
                done.new += self._upsert(spider, [one])
                done.entries.append(entry)
            except self._sa.exc.SQLAlchemyError as exc:
                if _connection_error(self._sa, exc):
                    raise
                done.errors.append((entry.id, mask_text(f"{type(exc).__name__}: {exc}")))
        return done

    def _upsert(self, spider: str, rows: list[dict[str, Any]]) -> int:
        """Store *rows* (the last of each entry id), over those the table holds; returns
        how many were not in it (an entry copied again after a kill or a retry is not).
        In entry id order: writers of the same entries lock their rows in the same order
        (in opposite orders, each waited for the other: a deadlock)."""
        rows = sorted({r["entry_id"]: r for r in rows}.values(), key=lambda r: r["entry_id"])
        t = self.table
        with self.engine.begin() as conn:
            dialect = self.engine.dialect.name
            if dialect not in ("sqlite", "postgresql"):  # delete and insert
                new = 0
                for r in rows:
                    where = (t.c.spider == spider, t.c.entry_id == r["entry_id"])
                    new += conn.execute(t.delete().where(*where)).rowcount == 0
                conn.execute(t.insert(), rows)
                return new
            insert = dialect_insert(dialect)(t)
            keys = ["spider", "entry_id"]
            if not self.engine.dialect.insert_returning:  # SQLite before 3.35
                return _upsert_counted(conn, insert, rows)
            # new rows first: what ON CONFLICT DO NOTHING returns is what was not there
            added = conn.execute(
                insert.on_conflict_do_nothing(index_elements=keys).returning(t.c.entry_id), rows
            )
            inserted = {r.entry_id for r in added}
            held = [r for r in rows if r["entry_id"] not in inserted]
            if held:  # then the others, over their rows
                changed = {c: insert.excluded[c] for c in held[0] if c not in keys}
                conn.execute(insert.on_conflict_do_update(index_elements=keys, set_=changed), held)
            return len(inserted)

    def rows(self, spider: str | None = None) -> list[dict[str, Any]]:
        """Every row (of *spider*), ordered by spider and last failure."""
        t = self.table
        query = self._sa.select(t).order_by(t.c.spider, t.c.last_failure, t.c.entry_id)
        if spider is not None:
            query = query.where(t.c.spider == spider)
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    def close(self) -> None:
        self.engine.dispose()


@dataclass
class Written:
    """What :meth:`Archive.write` did: the entries written, and (entry id, error) for each
    entry the database refused (it stays in Redis, kept by retention)."""

    entries: list[DeadEntry]
    errors: list[tuple[str, str]]
    #: rows of :attr:`entries` the table did not hold before (the others were updated)
    new: int = 0


def _upsert_counted(conn: sqlalchemy.Connection, insert: Any, rows: list[dict[str, Any]]) -> int:
    """The upsert without ``INSERT ... RETURNING`` (SQLite 3.24 to 3.34): the rows ``ON
    CONFLICT DO NOTHING`` inserts are counted by the statement's changes (the first
    write of the transaction, so no other writer comes between it and the update), then
    every row is written over what the table holds (the new ones with the same values)."""
    keys = ["spider", "entry_id"]
    new: int = conn.execute(insert.on_conflict_do_nothing(index_elements=keys), rows).rowcount
    changed = {c: insert.excluded[c] for c in rows[0] if c not in keys}
    conn.execute(insert.on_conflict_do_update(index_elements=keys, set_=changed), rows)
    return new


def _connection_error(sa: Any, exc: Exception) -> bool:
    """Whether *exc* says the database cannot be reached (every row would fail the same)."""
    return isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError)) or bool(
        getattr(exc, "connection_invalidated", False)
    )


def dialect_insert(dialect: str) -> Any:
    """SQLAlchemy's ``insert`` of *dialect* (SQLite's, else PostgreSQL's: both upsert)."""
    if dialect == "sqlite":
        from sqlalchemy.dialects import sqlite

        return sqlite.insert
    from sqlalchemy.dialects import postgresql

    return postgresql.insert


def connect_args(url: str, timeout: float = CONNECT_TIMEOUT) -> dict[str, Any]:
    """The driver's argument that bounds a connection attempt to *timeout* seconds."""
    if url.startswith("sqlite"):
        return {"timeout": timeout}
    if url.startswith("postgresql"):
        return {"connect_timeout": timeout}
    return {}


@dataclass
class ArchiveRun:
    """What :func:`archive_crawl` did."""

    dead: int = 0  # entries in the dead-letter queue
    copied: int = 0  # copied now (or that would be, with dry_run)
    by_class: dict[str, int] | None = None
    #: (entry id, error) of each entry the database refused: it stays in Redis
    errors: list[tuple[str, str]] = field(default_factory=list)


async def archive_crawl(
    dlq: DeadLetterQueue, archive: Archive, *, dry_run: bool = False
) -> ArchiveRun:
    """Copy every dead letter of *dlq*'s crawl (every shard's) that *archive* does not hold
    yet into it (upserts: run twice, the same rows), declaring the archive first; with
    *dry_run*, only count them. What other archives hold does not count."""
    run = ArchiveRun(by_class={})
    assert run.by_class is not None
    if not dry_run:
        await in_daemon_thread(archive.create)
    for part, outside in parts(dlq):
        if not dry_run:
            await declare(part.client, part.keys, archive)
            await forget_gone(part.client, part.keys)
        run.dead += int(await part.client.zcard(part.keys.dead))
        async for batch in unarchived(part, archive.sink):
            if not batch:
                continue
            if not dry_run:  # (rows named as the crawl's queue names them, marks as the shard)
                named = {outside(e.id): e for e in batch}
                rows = [replace(e, id=i) for i, e in named.items()]
                written = await in_daemon_thread(archive.write, dlq.keys.spider, rows)
                batch = [named[e.id] for e in written.entries]
                await mark(part.client, part.keys, archive.sink, batch)
                run.errors += written.errors
            run.copied += len(batch)
            for e in batch:
                run.by_class[e.failure_class] = run.by_class.get(e.failure_class, 0) + 1
    return run
