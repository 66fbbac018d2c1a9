"""A revisited URL whose visit fails (a 404, a 5xx past its retries) is not given up at
once: it goes back to its revisit schedule at its interval, counted as a failed visit, and
is dead-lettered only after ``HA_REVISIT_MAX_FAILURES`` failed visits in a row (a visit
that succeeds starts the count again); a URL whose first visit fails is dead-lettered as
any request (against bench/freshness_site.py, whose pages fail when the test says)."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any
from urllib.request import urlopen

import pytest
from scrapy import Request
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha import metakeys
from scrapy_ha.config.continuous import RevisitConfig, RevisitState
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.ops.revisits import revisit_numbers, status_lines
from scrapy_ha.scheduler.revisits import Revisits
from scrapy_ha.verdict import FailureClass, Verdict
from tests import test_revisit_conditional as conditional
from tests.cli_seed import scrapy_ha
from tests.test_revisit_conditional import (  # noqa: F401 (pytestmark)
    KEYS,
    PagesSpider,
    pytestmark,
    settings,
    stop,
    until,
)


def _get(url: str) -> Any:
    with urlopen(url) as r:
        return r.read()


def statuses(base: str, page: int) -> list[int]:
    return [s for _, p, s, _ in json.loads(_get(f"{base}/_log")) if p == page]


def times(base: str, page: int, status: int) -> list[float]:
    return [t for t, p, s, _ in json.loads(_get(f"{base}/_log")) if p == page and s == status]


async def fail(base: str, page: int, status: int, to: str = "") -> None:
    """Page *page* answers *status* from now on (a 3xx redirecting to *to*, if said)."""
    where = f"&to={to}" if to else ""
    await asyncio.to_thread(_get, f"{base}/_fail?page={page}&status={status}{where}")


changing_site = conditional.changing_site  # the fixture


def dead_ids(redis_client: Any) -> list[bytes]:
    return list(redis_client.hkeys(KEYS.dead_info))


@deferred_f_from_coro_f
async def test_a_revisited_page_that_fails_goes_on_being_revisited(
    redis_url, redis_client, changing_site
):
    """Before, the first 404 of page 0 dead-lettered its revisit entry: it was never
    fetched again (and a crawl whose last revisit it was finished)."""
    base = changing_site("--static")
    extra = {"HA_REVISIT_MAX_FAILURES": 4}  # page 0 fails 2 (or 3, if slow) in a row
    crawler = get_crawler(PagesSpider, settings(redis_url, **extra))
    crawling = asyncio.ensure_future(crawler.crawl_async(base_url=base))
    await until(lambda: len(statuses(base, 0)) >= 2, "a revisit of page 0", crawling)
    await fail(base, 0, 404)
    await until(lambda: statuses(base, 0).count(404) >= 2, "two failed visits", crawling)
    await fail(base, 0, 0)  # back: a visit that succeeds starts the count again
    await until(lambda: statuses(base, 0)[-1] != 404, "a visit after the failures", crawling)
    first = statuses(base, 0).count(404)
    await fail(base, 0, 404)
    more = lambda: statuses(base, 0).count(404) >= first + 2  # noqa: E731
    await until(more, "two more failed visits", crawling)
    await fail(base, 0, 0)
    await until(lambda: statuses(base, 0)[-1] != 404, "a visit after those", crawling)
    # page 1 fails for good: dead-lettered at its fourth failed visit in a row
    await fail(base, 1, 404)
    await until(lambda: dead_ids(redis_client), "page 1 dead-lettered", crawling)
    await stop(crawling, redis_client)
    assert statuses(base, 1).count(404) == 4
    (record,) = (json.loads(v) for v in redis_client.hvals(KEYS.dead_info))
    assert record["class"] == "gone"
    assert "4 failed visits in a row" in record["reason"], record
    failed = times(base, 0, 404)
    gaps = [b - a for a, b in zip(failed, failed[1:], strict=False)]
    assert min(gaps) >= 0.9, gaps  # at its interval (1 s), not sooner
    stats = crawler.stats
    failed_visits = statuses(base, 0).count(404) + 3  # page 0's, page 1's first three
    assert stats.get_value("ha/revisit/failed_visits") == failed_visits
    crawl = {k.decode(): int(v) for k, v in redis_client.hgetall(KEYS.stats).items()}
    assert crawl["revisited:failed"] == failed_visits
    assert crawl["acked"] == crawl["revisited"] - failed_visits  # a failed visit is no ack
    payloads = {
        json.loads(p)["u"].rsplit("/", 1)[1]: json.loads(p)
        for p in redis_client.hvals(KEYS.payload)
    }
    assert "f" not in payloads["0"]["mt"]["ha_revisit_state"]  # reset by its last success


def test_a_url_whose_first_visit_fails_is_dead_lettered_as_any_request():
    revisits = Revisits(RevisitConfig(max_failures=5), lambda r: b"fp")
    request = Request("http://a.example/p", meta={"ha_revisit": 60})
    request.meta[metakeys.OUTCOME] = Verdict.dead(FailureClass.GONE, "HTTP 404", status=404)
    assert revisits.failed_visit(request) is None  # never found: a broken link, said now


def test_failed_visits_count_in_a_row_and_the_last_is_dead_lettered():
    revisits = Revisits(RevisitConfig(max_failures=2), lambda r: b"fp")
    state = RevisitState(interval=60.0, visits=3, signature="abc").as_meta()
    request = Request("http://a.example/p", meta={"ha_revisit": 60, metakeys.REVISIT_STATE: state})
    request.meta[metakeys.OUTCOME] = Verdict.dead(FailureClass.SERVER, "HTTP 503", status=503)
    visit = revisits.failed_visit(request)
    assert visit is not None and (visit.interval, visit.found) == (60.0, "failed")
    assert metakeys.OUTCOME not in request.meta  # the next visit starts afresh
    after = RevisitState.from_meta(request.meta[metakeys.REVISIT_STATE])
    assert (after.failures, after.visits, after.signature) == (1, 3, "abc")
    request.meta[metakeys.OUTCOME] = Verdict.dead(FailureClass.SERVER, "HTTP 503", status=503)
    assert revisits.failed_visit(request) is None  # the second in a row: dead-lettered
    verdict = Verdict.from_meta(request.meta)
    assert verdict is not None and verdict.reason == "HTTP 503 (2 failed visits in a row)"
    # a requeue of its dead letter starts the count again
    assert RevisitState.from_meta(request.meta[metakeys.REVISIT_STATE]).failures == 0


@pytest.mark.parametrize("value", [0, -1, 1.5, "many"])
def test_a_bad_max_failures_names_the_setting(value):
    message = re.escape(f"HA_REVISIT_MAX_FAILURES={value!r} must be a whole number of 1")
    with pytest.raises(ConfigError, match=message):
        RevisitConfig.from_settings(Settings({"HA_REVISIT_MAX_FAILURES": value}))


def test_a_visit_that_succeeds_starts_the_count_again():
    """A 304 keeps the state it answers to: before, it kept the failures counted too."""
    revisits = Revisits(RevisitConfig(max_failures=2), lambda r: b"fp")
    state = RevisitState(interval=60.0, visits=3, etag='"a"', failures=1)
    request = Request("http://a.example/p", meta={"ha_revisit": 60})
    request.meta[metakeys.REVISIT_SEEN] = ("not_modified", state)
    assert revisits.visit_end(request) is not None
    assert RevisitState.from_meta(request.meta[metakeys.REVISIT_STATE]).failures == 0


def test_failed_visits_are_shown_with_the_other_revisit_figures():
    numbers = revisit_numbers({"revisited:new": 3, "revisited:failed": 2}, 3, 1)
    assert numbers.found == {"new": 3, "failed": 2}
    assert "found new 3, failed 2" in status_lines(numbers)[0]
    assert numbers.change_rate is None  # a failed visit tells nothing of a change


@deferred_f_from_coro_f
async def test_seen_check_says_a_dead_lettered_revisit_is_no_longer_revisited(
    redis_url, redis_client, changing_site
):
    """``scrapy-ha seen check`` of a URL whose revisits ended in the dead-letter queue (its
    page gone for good) says so. Before, it said ``revisited (entry N)``, as of a URL still
    revisited (the dead letter keeps its fingerprint in ``ha:{S}:revisit_urls``)."""
    base = changing_site("--static")
    crawler = get_crawler(PagesSpider, settings(redis_url, HA_REVISIT_MAX_FAILURES=1))
    crawling = asyncio.ensure_future(crawler.crawl_async(base_url=base))
    await until(lambda: len(statuses(base, 1)) >= 1, "a visit of page 1", crawling)
    await fail(base, 1, 404)
    await until(lambda: dead_ids(redis_client), "page 1 dead-lettered", crawling)
    await stop(crawling, redis_client)
    (entry,) = dead_ids(redis_client)
    urls = (f"{base}/p/1", f"{base}/p/0")
    check = await asyncio.to_thread(
        scrapy_ha, "seen", "check", "pages", *urls, "--redis-url", redis_url
    )
    assert check.returncode == 0, check.stderr
    gone, kept = check.stdout.splitlines()
    assert f"no longer revisited: its entry {entry.decode()} is in the dead-letter" in gone, gone
    assert "; revisited (entry " in kept, kept  # (its next visit, or due since: stopped)
    assert ", next visit " in kept or ", due since " in kept, kept
