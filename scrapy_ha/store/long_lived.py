"""A client kept for hours between commands (the dashboard, ``watch``) outlives a Redis
restart: a pooled connection that Redis closed while it sat unused is connected afresh
before its next command, instead of failing that command once.

Only a connection whose close has already been read (end of stream, or a reset) is
replaced, before anything is written on it: the command it carries has reached no server,
so even a write (a dashboard's requeue) runs once. A connection that dies in the middle of
a command still fails it, as does a Redis that cannot be reached (the dashboard's 503).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy_ha.store.connection import _mix_in

if TYPE_CHECKING:
    import asyncio

__all__ = ["long_lived"]


def long_lived(client: Any) -> Any:
    """*client* (of :func:`~scrapy_ha.store.connection.redis_from_settings`, before its
    first command), its connections made :class:`_AsyncReconnectsClosed`."""
    _mix_in(client, _AsyncReconnectsClosed)
    return client


class _AsyncReconnectsClosed:
    """A connection that, closed by the server since its last command, connects again
    before its next one.

    redis-py's pool makes that check as it hands a connection out (``ensure_connection``),
    but skips it while maintenance notifications are enabled, and its default, ``"auto"``,
    counts as enabled (redis-py 8.1): after Redis restarted, every pooled connection failed
    its next command, each once, and the dashboard answered 503 to every other request
    though Redis was back. The pool calls ``connect`` on every connection it hands out."""

    async def connect(self) -> None:
        # (read with a default: a redis-py that names them otherwise is left as it is)
        reader: asyncio.StreamReader | None = getattr(self, "_reader", None)
        writer: asyncio.StreamWriter | None = getattr(self, "_writer", None)
        if reader is not None and writer is not None and _closed(reader, writer):
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
        await super().connect()  # type: ignore[misc]


def _closed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Whether the server closed the connection: end of stream read (a shutdown, a killed
    process: nothing left unread), a reset, or the transport closed."""
    return reader.at_eof() or reader.exception() is not None or writer.is_closing()
