"""``scrapy-ha``: look at and operate a crawl's queue from the shell (:mod:`.cmdline` parses
and dispatches; one module per group of commands)."""

from scrapy_ha.cli.cmdline import main

__all__ = ["main"]
