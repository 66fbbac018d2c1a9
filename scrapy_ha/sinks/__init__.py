"""Sinks that store the crawl's items exactly once, read from its item stream.

With ``HA_ITEMS = "outbox"`` workers commit a page's items to the crawl's item stream with
the page's ack (:mod:`scrapy_ha.scheduler.items`). A consumer (:mod:`.consumer`) reads the
stream in a consumer group, one group per sink, hands each batch to its sink, and
acknowledges the entries only once the sink has committed them, idempotently, keyed by the
entry's id: JSON Lines with a durable offset (:mod:`.jsonl`), SQL through SQLAlchemy with
an upsert keyed by the entry (:mod:`.sql`), or the project's own item pipelines
(:mod:`.pipelines`). Public as :mod:`scrapy_ha.items`; ``scrapy-ha items`` runs one.
"""
