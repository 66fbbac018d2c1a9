"""A webhook that answers the alert with a redirect: the alert is not followed there. urllib
followed a 301, 302 or 303 as a GET without the alert's body, to any host, with the
webhook's credentials (the ``user:password@`` of ``HA_DLQ_ALERT_WEBHOOK``, sent as Basic
authentication), and the worker counted the alert as sent."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.keys import Keys
from tests.spiders import FaultSpider
from tests.test_alerts import settings
from tests.test_proxy_pool_redirect import Api

if TYPE_CHECKING:
    from collections.abc import Iterator

PASSWORD = "hook-pw-73c2a1"


def server(host: str, status: int, location: str = "") -> Api:
    """An HTTP server on loopback *host* that records each request and answers with
    *status* (and *location*)."""
    headers = {"Location": location} if location else {}
    return Api(host, lambda path, auth: (status, headers, b""))  # noqa: ARG005


@pytest.fixture
def elsewhere() -> Iterator[Api]:
    """Another host (127.0.0.2) the webhook sends its callers to."""
    other = server("127.0.0.2", 200)
    yield other
    other.close()


@pytest.mark.parametrize("status", [301, 302, 303])
@deferred_f_from_coro_f
async def test_a_webhook_that_redirects_gets_no_credentials_sent_elsewhere(
    redis_url, redis_client, site, elsewhere, caplog, status
):
    hook = server("127.0.0.1", status, location=f"{elsewhere.url}/landing")
    webhook = hook.url.replace("://", f"://alerts:{PASSWORD}@") + "/hook"
    try:
        crawler = get_crawler(FaultSpider, settings(redis_url, webhook, threshold=1))
        with caplog.at_level(logging.WARNING):
            await crawler.crawl_async(base_url=site.url, paths=("/status/404?a",))
    finally:
        hook.close()
    assert redis_client.zcard(Keys("ha", "faults").dead) == 1
    assert [(m, p) for m, p, _ in hook.requests] == [("POST", "/hook")]
    assert not elsewhere.requests, f"the alert went on to another host: {elsewhere.requests}"
    # not delivered: said, counted as an error, not as sent
    assert crawler.stats.get_value("ha/alert/sent") is None
    assert crawler.stats.get_value("ha/alert/errors") == 1
    assert f"HTTP Error {status}" in caplog.text and PASSWORD not in caplog.text
