"""The exporter run as an ACL user that may not run ``INFO`` (a read-mostly monitoring
user: ``INFO`` is in ``@dangerous``) serves the crawls' series, without Redis's memory ones.
A QA run: every scrape said ``scrapy_ha_redis_up 0`` and nothing else, and the log called
a Redis that answered "unreachable". A real redis-server and a real exporter process."""

from __future__ import annotations

from tests.cli_seed import scrapy_ha
from tests.test_acl_no_info import no_info_url
from tests.test_metrics import exporter_factory, value

__all__ = ["exporter_factory", "no_info_url"]


def test_a_user_without_info_gets_the_crawls_series(redis_url, no_info_url, exporter_factory):
    pushed = scrapy_ha("push", "books", "http://a.test/1", "--create", "--redis-url", redis_url)
    assert pushed.returncode == 0, pushed.stderr
    samples = exporter_factory(no_info_url).scrape()
    assert value(samples, "scrapy_ha_redis_up") == 1
    assert value(samples, "scrapy_ha_enqueued_total", spider="books") == 1
    names = {name for name, _ in samples}
    assert "scrapy_ha_redis_memory_used_bytes" not in names  # not known: not a false 0
    assert "scrapy_ha_redis_evicted_keys_total" not in names
