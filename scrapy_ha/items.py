"""A crawl's items, exactly once, from Python: the consumers of the item stream and their sinks.

With ``HA_ITEMS = "outbox"`` workers commit each page's items to the crawl's item stream
with the page's ack; :func:`consume` (or ``scrapy-ha items SPIDER --to ...``) reads the
stream into a sink that stores each item once: :class:`JsonLinesSink`, :class:`SqlSink`,
:class:`PipelinesSink` (the project's own pipelines; they key their writes by
:func:`current_entry`), or a class of your own that follows :class:`Sink`.

The documented import path; the implementation is in :mod:`scrapy_ha.sinks`.
"""

from scrapy_ha.sinks.consumer import (
    ConsumerReport,
    Entry,
    ItemConsumer,
    Sink,
    consume,
    default_consumer,
)
from scrapy_ha.sinks.jsonl import JsonLinesSink
from scrapy_ha.sinks.pipelines import PipelinesSink, current_entry
from scrapy_ha.sinks.sql import SqlSink

__all__ = [
    "ConsumerReport",
    "Entry",
    "ItemConsumer",
    "JsonLinesSink",
    "PipelinesSink",
    "Sink",
    "SqlSink",
    "consume",
    "current_entry",
    "default_consumer",
]
