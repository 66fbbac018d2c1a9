"""``scrapy-ha``: look at and operate a crawl's queue from the shell (:mod:`.main` parses
and dispatches; one module per group of commands)."""

from scrapy_ha.cli import main

__all__ = ["main"]
