"""Scrapy's incremental re-run idiom: crawl, stop, run the same crawl again with its state
kept (``JOBDIR`` in Scrapy, ``SCHEDULER_PERSIST = True`` with scrapy-ha and scrapy-redis).

Not one of Scrapy's own test files (Scrapy tests the pieces: ``test_dupefilters.py``'s
``test_dupefilter_path`` reopens a JOBDIR dupefilter): scrapy-ha's test of what users do
with them, in Scrapy's style, with Scrapy's mock server and ``FollowAllSpider``. The
second run fetches the start request again (it is ``dont_filter``) and filters every link
the first run followed: on the 11-page follow site, 1 page. With
``SCRAPY_HA_CONFORMANCE_BASELINE=1`` it runs against Scrapy's scheduler and JOBDIR.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from scrapy.utils.test import get_crawler

from tests.scrapy_conformance.scheduler_under_test import BASELINE_ENV
from tests.scrapy_conformance.spiders import FollowAllSpider
from tests.scrapy_conformance.utils.decorators import coroutine_test

if TYPE_CHECKING:
    from pathlib import Path

    from tests.scrapy_conformance.mockserver.http import MockServer


def _kept(tmp_path: Path) -> dict[str, Any]:
    """The settings that keep a crawl's state for the next run."""
    if os.environ.get(BASELINE_ENV) == "1":
        return {"JOBDIR": str(tmp_path / "job")}
    return {"SCHEDULER_PERSIST": True}


async def _run(mockserver: MockServer, settings: dict[str, Any]) -> list[str]:
    crawler = get_crawler(FollowAllSpider, settings)
    await crawler.crawl_async(mockserver=mockserver, order="asc")
    assert isinstance(crawler.spider, FollowAllSpider)
    return crawler.spider.urls_visited


class TestRerun:
    @coroutine_test
    async def test_rerun_fetches_the_start_page_and_filters_what_it_saw(
        self, mockserver: MockServer, tmp_path: Path
    ) -> None:
        settings = _kept(tmp_path)
        first = await _run(mockserver, settings)
        assert len(first) == 11  # 10 + start_url
        second = await _run(mockserver, settings)
        assert second == first[:1]  # the start page again; its links were seen

    @coroutine_test
    async def test_every_rerun_fetches_the_start_page(
        self, mockserver: MockServer, tmp_path: Path
    ) -> None:
        settings = _kept(tmp_path)
        runs = [await _run(mockserver, settings) for _ in range(3)]
        assert [len(urls) for urls in runs] == [11, 1, 1]
