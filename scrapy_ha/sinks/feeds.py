"""Scrapy's feed exports (``-o items.jl``, ``FEEDS``) to a local file that a SIGKILL does not
cut short: every item written reaches the file before the next one is exported.

Why: Scrapy's ``FileFeedStorage`` opens the file with Python's buffer (8 KB), flushed when
it fills and when the crawl closes. A worker killed with SIGKILL (or by the OOM killer) lost
what the buffer held, ten to a hundred items, whose pages scrapy-ha had acked once their
items had gone through the pipelines and into the exporter: no other worker crawled them
again. With this storage each write is flushed to the operating system at once, so what
the exporter was given is in the file whatever kills the process after (not a power loss:
nothing is fsynced). The add-on sets it for local files (``FEED_STORAGES``, the schemes
``""`` and ``file``) unless the project set its own.

A feed in JSON lines is the one to read after a kill: a JSON array (``-o items.json``) has
no closing bracket then. Storages that upload at the close (S3, FTP, GCS) write to a
temporary file and send nothing of a killed worker's, and a compressed feed
(``postprocessing``) loses what its compressor holds: use ``HA_ITEMS = "outbox"`` for those
(docs/reliability.md). A feed opened with ``overwrite`` (``-O``) is emptied when its worker
starts again: append. Items are exported at least once: those of a page redone after a kill
twice.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy.extensions.feedexport import FileFeedStorage

if TYPE_CHECKING:
    from scrapy import Spider

__all__ = ["WrittenThroughFileFeedStorage"]


class _WrittenThrough(io.BufferedWriter):
    """A buffered file flushed after every write: a write is whole (a raw file may take
    part of it), and it is in the file when the call returns."""

    def write(self, data: Any) -> int:
        written = super().write(data)
        self.flush()
        return written


class WrittenThroughFileFeedStorage(FileFeedStorage):
    """Scrapy's local-file feed storage, each write flushed (see the module)."""

    def open(self, spider: Spider) -> Any:
        path = Path(self.path)
        if not path.parent.exists():
            path.parent.mkdir(parents=True)
        return _WrittenThrough(io.FileIO(path, self.write_mode))
