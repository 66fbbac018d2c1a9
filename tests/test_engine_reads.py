"""How scheduler.engine reads ``crawler.engine`` (a few times per page): Scrapy 2.19 keeps
it in ``crawler._engine`` behind a descriptor that raises before the crawl starts."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import scrapy.crawler
from scrapy import Spider
from scrapy.utils.test import get_crawler

from scrapy_ha.scheduler.engine import _engine

if TYPE_CHECKING:
    import pytest


def _counted_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []
    descriptor = getattr(scrapy.crawler, "_LateAttribute", None)
    if descriptor is None:  # Scrapy before 2.19: a plain attribute, no descriptor to count
        return reads
    get = descriptor.__get__

    def counted(self: Any, instance: Any, owner: Any) -> Any:
        if instance is not None:
            reads.append(self._name)
        return get(self, instance, owner)

    monkeypatch.setattr(descriptor, "__get__", counted)
    return reads


def test_a_started_crawlers_engine_is_read_without_its_descriptor(monkeypatch):
    crawler = get_crawler(Spider)
    engine = SimpleNamespace()
    crawler.engine = engine  # as the crawl's start sets it
    reads = _counted_reads(monkeypatch)
    assert _engine(crawler) is engine
    assert "engine" not in reads


def test_before_the_crawl_starts_there_is_no_engine():
    assert _engine(get_crawler(Spider)) is None


def test_a_stand_in_crawler_is_read_by_its_attribute():
    engine = SimpleNamespace()
    assert _engine(SimpleNamespace(engine=engine)) is engine
    assert _engine(SimpleNamespace(engine=None)) is None
