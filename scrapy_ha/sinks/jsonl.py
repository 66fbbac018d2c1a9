"""A JSON Lines file that gets every item of the stream once, whenever its consumer dies.

Each batch is appended to the file and made durable (``fsync``); then the offset file next
to it (``<file>.offset``) is replaced, atomically and durably, by the file's new length and
the ids of that batch; then the consumer acknowledges the batch in Redis. Started again
after a kill, the sink cuts the file back to the length the offset file records (a batch
written but not recorded is gone, and is delivered again: the first batch too, as the offset
file is written when the sink first opens the file), and the consumer acknowledges
the ids the offset file lists (a batch recorded but maybe not acknowledged is in the file
already). So the file holds each item once.

The file's exactly-once rests on the file and its offset: only a consumer started again
under the same name (by default, made of the host and the file's path) finishes the
entries this one left pending; no other consumer of the group takes them over
(``shares = False``). Several files in one group share the work, each with its consumer.
A consumer holds an exclusive lock on its file (``flock``) from its start to its end: a
second consumer of the same file fails at start, with an error that names the file.

``--retry-aside`` writes with :attr:`JsonLinesSink.journal` on: the ids it writes are also
added to the offset file's ``retried`` list, in the same atomic replacement that records the
new length, and every later batch (the file's consumer's too) carries the list over. A
``--retry-aside`` killed between the write and the set-aside record's deletion finds the id
there at its next run, however many batches the consumer wrote meanwhile, and deletes the
record without writing the item again.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy_ha.codec import CodecError
from scrapy_ha.config.validate import ConfigError

if TYPE_CHECKING:
    from scrapy_ha.sinks.consumer import Entry

__all__ = ["JsonLinesSink"]

logger = logging.getLogger(__name__)

#: The offset file's name: the data file's, with this added.
OFFSET_SUFFIX = ".offset"


class JsonLinesSink:
    """Appends each item as a JSON line (its plain form, see :mod:`scrapy_ha.codec.items`)."""

    shares = False

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).absolute()
        self.offset_path = self.path.with_name(self.path.name + OFFSET_SUFFIX)
        self.length = 0
        #: entries that could not be read (not JSON): left out, logged (a consumer sets such an
        #: entry aside before any write: only ``--retry-aside`` hands one here)
        self.skipped = 0
        #: ids ``--retry-aside`` wrote to the file (the offset file's ``retried``), carried
        #: over by every batch until ``--retry-aside`` deletes the id's record
        #: (:meth:`forget_retried`: the next write records the list without it)
        self.retried: list[str] = []
        #: ``--retry-aside`` writes: each id written is added to :attr:`retried`
        self.journal = False
        self._fd: int | None = None

    @property
    def consumer(self) -> str:
        """The consumer name that finds this file's pending entries again after a kill:
        the host and the file's absolute path. The host stays in it: files at the same path
        on two machines share the default group (``jsonl:<path>``), one consumer each. A
        container whose hostname changes at each start passes a stable name instead
        (``--consumer``)."""
        return f"{socket.gethostname()}:{self.path}"

    async def open(self) -> list[str]:
        return await asyncio.to_thread(self._open)

    def _open(self) -> list[str]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self._lock()
        try:
            return self._resume()
        except BaseException:
            os.close(self._fd)  # and its lock: a consumer started again may take the file
            self._fd = None
            raise

    def _resume(self) -> list[str]:
        """The file as its offset file records it: cut back to the recorded length (a
        batch written after it is delivered again); the ids of the batch recorded last."""
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        recorded = self._read_offset()
        if recorded is None:  # a file of its own, or one this sink never wrote: append,
            self.length = size  # from a length recorded before the first batch is written
            self._record([])
            return []
        self.length, ids, self.retried = recorded
        if size > self.length:  # a batch written and not recorded: delivered again
            os.ftruncate(self._fd, self.length)
            os.fsync(self._fd)
            logger.info(
                "%s: cut back to %d bytes (a batch written after the last recorded one is "
                "written again)",
                self.path,
                self.length,
            )
        elif size < self.length:
            raise OSError(
                f"{self.path} is {size} bytes, shorter than the {self.length} its offset file "
                f"{self.offset_path} records: it was changed by hand; restore it, or move both "
                f"away to start a new file"
            )
        return ids

    def _lock(self) -> None:
        """Hold the file's exclusive lock until :meth:`close` (the system lets go of it when
        the process dies): two consumers appending to one file would overwrite each other's
        lines and offsets."""
        assert self._fd is not None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            self._fd = None
            raise ConfigError(
                f"{self.path} is in use by another consumer (it holds the file's lock): one "
                f"consumer per JSON Lines file; stop that one, or give this one a file of its "
                f"own (several files may share a group with --group)"
            ) from None

    def _read_offset(self) -> tuple[int, list[str], list[str]] | None:
        try:
            doc = json.loads(self.offset_path.read_text())
        except FileNotFoundError:
            return None
        retried = [str(i) for i in doc.get("retried", [])]
        return int(doc["length"]), [str(i) for i in doc.get("batch", [])], retried

    async def write(self, entries: list[Entry]) -> int:
        return await asyncio.to_thread(self._write, entries)

    def forget_retried(self, entry_id: str) -> None:
        """``--retry-aside`` deleted *entry_id*'s record: it never comes back, and the next
        write records :attr:`retried` without it (the list stays short, and each write's
        offset file small)."""
        if entry_id in self.retried:
            self.retried = [i for i in self.retried if i != entry_id]

    def _write(self, entries: list[Entry]) -> int:
        assert self._fd is not None
        lines, written = [], []
        for entry in entries:
            try:
                plain = entry.plain()
            except CodecError as exc:
                self.skipped += 1
                logger.error("Stream entry %s is not an item (%s): left out", entry.id, exc)
                continue
            lines.append(_line(plain))
            written.append(entry.id)
        if not lines:  # nothing written: the offset file keeps the batch it names
            return 0
        data, before = b"".join(lines), self.retried
        if self.journal:  # recorded with the new length, in one replacement
            self.retried = before + written
        try:
            _write_all(self._fd, data, self.length)
            os.fsync(self._fd)
            # only the ids of lines written: --retry-aside deletes a record the batch names
            self._record(written, self.length + len(data))
        except Exception:
            os.ftruncate(self._fd, self.length)  # no part of the batch stays in the file
            self.retried = before
            raise
        self.length += len(data)
        return len(lines)

    def _record(self, ids: list[str], length: int | None = None) -> None:
        """Replace the offset file, durably: the new name is in the directory before the
        consumer acknowledges the batch."""
        tmp = self.offset_path.with_name(self.offset_path.name + ".tmp")
        length = self.length if length is None else length
        doc = {"length": length, "batch": ids, "retried": self.retried}
        with tmp.open("w") as out:
            json.dump(doc, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.offset_path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    async def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _line(plain: Any) -> bytes:
    """One item as a line of UTF-8 JSON; a string holding a lone surrogate (half an emoji
    cut by an API) has its non-ASCII characters escaped (``\\ud83d``), as JSON allows,
    instead of failing its batch for ever. A float JSON has not (``NaN``, ``Infinity``) is
    a ValueError: the item's fault, set aside (a strict reader fails on such a line)."""
    text = json.dumps(plain, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        return (text + "\n").encode()
    except UnicodeEncodeError:
        return (json.dumps(plain, separators=(",", ":")) + "\n").encode()


def _write_all(fd: int, data: bytes, offset: int) -> None:
    """Write *data* at *offset*, all of it: ``pwrite`` may write part (a disk nearly full,
    a file size limit) and say so only by its count."""
    done = 0
    while done < len(data):
        n = os.pwrite(fd, data[done:], offset + done)
        if n <= 0:
            raise OSError(f"wrote {done} of {len(data)} bytes")
        done += n
