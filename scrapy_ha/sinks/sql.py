"""An SQL table that gets every item of the stream once: an upsert keyed by the entry.

Each batch is written in one transaction, an insert-or-update keyed by ``(spider,
entry_id)`` (``ON CONFLICT DO UPDATE`` in SQLite and PostgreSQL; a delete and an insert in
one transaction elsewhere); the consumer acknowledges the batch once the transaction has
committed. A consumer killed mid-batch rolls the transaction back (the batch is delivered
again); one killed between the commit and the acknowledgement has its batch delivered again
and written over itself. Any consumer of the group may take over what another left pending
(``shares = True``): the key is the table's.

The table, created if missing (needs ``pip install 'scrapy-ha[archive]'``: SQLAlchemy, and
psycopg for PostgreSQL): ``spider``, ``entry_id`` (the primary key), ``item`` (JSON: the
item's plain form, see :mod:`scrapy_ha.codec.items`), ``committed_at`` (when the worker's
ack committed it, UTC).
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from scrapy_ha.codec import CodecError
from scrapy_ha.codec.masking import mask_text, mask_url
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.deadletters._threads import in_daemon_thread
from scrapy_ha.deadletters.archive import connect_args, dialect_insert
from scrapy_ha.deadletters.marks import durable_url

if TYPE_CHECKING:
    import sqlalchemy

    from scrapy_ha.sinks.consumer import Entry

__all__ = ["DEFAULT_TABLE", "SqlSink"]

logger = logging.getLogger(__name__)

#: The table's default name: prefixed so that it sits next to an application's own tables.
DEFAULT_TABLE = "scrapy_ha_items"
#: A table name: letters, digits and underscores (it is written into SQL as an identifier).
TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
#: Times a consumer tries to create the table: another consumer creating it at the same
#: moment makes one attempt fail, the next finds it (and its index) there.
CREATE_ATTEMPTS = 5
#: Seconds a database has to accept a connection, and SQLite a writer to let go of the file
#: (several consumers of one SQLite file take turns).
CONNECT_TIMEOUT = 30


def _sqlalchemy() -> Any:
    try:
        import sqlalchemy
    except ImportError:
        raise ConfigError("the SQL item sink needs SQLAlchemy: pip install sqlalchemy") from None
    return sqlalchemy


def items_table(sa: Any, name: str) -> sqlalchemy.Table:
    """The items table *name*: (spider, entry_id) -> item, committed_at."""
    if not TABLE_NAME.match(name):
        raise ConfigError(
            f"item table {name!r}: use letters, digits and underscores (default {DEFAULT_TABLE})"
        )
    table: sqlalchemy.Table = sa.Table(
        name,
        sa.MetaData(),
        sa.Column("spider", sa.String(200), primary_key=True),
        sa.Column("entry_id", sa.String(64), primary_key=True),
        sa.Column("item", sa.JSON, nullable=False),
        sa.Column("committed_at", sa.DateTime(timezone=True), nullable=False, index=True),
    )
    return table


class SqlSink:
    """Writes the items of *spider*'s crawl into table *table* of the database at *url*."""

    shares = True

    def __init__(self, url: str, spider: str, table: str = DEFAULT_TABLE) -> None:
        sa = _sqlalchemy()
        self._sa = sa
        self.spider = spider
        self.display_url = mask_url(url)
        try:
            url = durable_url(sa, url, f"item sink {mask_url(url)!r}")
            self.display_url = mask_url(url)
            self.engine: sqlalchemy.Engine = sa.create_engine(
                url, connect_args=connect_args(url, CONNECT_TIMEOUT), pool_pre_ping=True
            )
        except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, ImportError) as exc:
            raise ConfigError(
                f"item sink {self.display_url!r}: {mask_text(str(exc))} (a SQLAlchemy URL "
                f"such as sqlite:///items.db or postgresql+psycopg://user:pw@host/db)"
            ) from None
        self.table = items_table(sa, table)
        #: entries that could not be read (not JSON): left out, logged (a consumer sets such an
        #: entry aside before any write: only ``--retry-aside`` hands one here)
        self.skipped = 0

    async def open(self) -> list[str]:
        await in_daemon_thread(self._create)
        return []  # nothing to recover: an entry written again is written over itself

    def _create(self) -> None:
        """Create the table and its index if missing. Consumers that start together race
        to create them: the losers find them there and go on."""
        for attempt in range(CREATE_ATTEMPTS):
            try:
                self.table.metadata.create_all(self.engine)
                return
            except self._sa.exc.DBAPIError:
                if attempt == CREATE_ATTEMPTS - 1:
                    raise

    async def write(self, entries: list[Entry]) -> int:
        return await in_daemon_thread(self._write, entries)

    def _write(self, entries: list[Entry]) -> int:
        rows = []
        for entry in entries:
            try:
                item = entry.plain()
            except CodecError as exc:
                self.skipped += 1
                logger.error("Stream entry %s is not an item (%s): left out", entry.id, exc)
                continue
            when = datetime.fromtimestamp(entry.committed_ms / 1000, UTC)
            rows.append(
                {"spider": self.spider, "entry_id": entry.id, "item": item, "committed_at": when}
            )
        if rows:
            with self.engine.begin() as conn:
                self._upsert(conn, rows)
        return len(rows)

    def _upsert(self, conn: Any, rows: list[dict[str, Any]]) -> None:
        dialect = self.engine.dialect.name
        if dialect in ("sqlite", "postgresql"):
            insert = dialect_insert(dialect)(self.table)
            changed = {"item": insert.excluded.item, "committed_at": insert.excluded.committed_at}
            conn.execute(
                insert.on_conflict_do_update(index_elements=["spider", "entry_id"], set_=changed),
                rows,
            )
            return
        t = self.table  # any other database: delete and insert, in the same transaction
        ids = [r["entry_id"] for r in rows]
        conn.execute(t.delete().where(t.c.spider == self.spider, t.c.entry_id.in_(ids)))
        conn.execute(t.insert(), rows)

    def rows(self) -> list[dict[str, Any]]:
        """Every row of the spider, by entry id (blocking)."""
        t = self.table
        query = self._sa.select(t).where(t.c.spider == self.spider).order_by(t.c.entry_id)
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    async def close(self) -> None:
        await in_daemon_thread(self.engine.dispose)
