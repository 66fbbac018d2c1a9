"""A spider's own proxy credentials (``meta["proxy"] = "http://user:pass@host:port"``, as
Scrapy's docs show it) never reach Redis: a request taken from Redis (by another worker, for
a retry, after a crash) goes to its proxy without them. The worker says so, once, with the
way out, instead of letting every such request end as a dead letter of class ``client``
(HTTP 407) without a word."""

from __future__ import annotations

import logging

import pytest
import scrapy

from scrapy_ha.codec import credentials as credentials_module
from scrapy_ha.codec import encode_request

PROXY = "http://u:s3cret@proxy.example:8080"


@pytest.fixture(autouse=True)
def warn_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(credentials_module, "_PROXY_CREDENTIALS_WARNED", [], raising=False)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_spiders_proxy_credentials_are_not_stored_and_the_worker_says_so(caplog):
    first = scrapy.Request("https://shop.example/a", meta={"proxy": PROXY})
    second = scrapy.Request("https://shop.example/b", meta={"proxy": PROXY})
    with caplog.at_level(logging.WARNING):
        payloads = [encode_request(first, None), encode_request(second, None)]
    assert all(b"s3cret" not in p and b"proxy.example:8080" in p for p in payloads)
    (said,) = warnings(caplog)  # once per process
    assert "https://shop.example/a" in said and "HTTP 407" in said
    assert "HA_PROXY_URL" in said and "s3cret" not in said


def test_a_downloaded_request_whose_credentials_are_in_the_header_is_not_said(caplog):
    """After HttpProxyMiddleware the credentials are in the header, whoever gave them: a
    middleware that sets them at each attempt loses nothing (a spider's own were said
    when the request was first stored)."""
    request = scrapy.Request(
        "https://shop.example/c",
        meta={"proxy": "http://proxy.example:8080", "_auth_proxy": "http://proxy.example:8080"},
        headers={"Proxy-Authorization": "Basic dTpzM2NyZXQ="},
    )
    with caplog.at_level(logging.WARNING):
        payload = encode_request(request, None)
    assert b"Proxy-Authorization" not in payload
    assert warnings(caplog) == []


@pytest.mark.parametrize(
    "meta",
    [
        {"proxy": "http://proxy.example:8080"},  # no credentials
        {"proxy": PROXY, "_scheme_proxy": True},  # the worker's environment: each has its own
        {"proxy": PROXY, "ha_proxy": "proxy.example:8080"},  # the add-on's: set at each attempt
    ],
)
def test_no_word_where_nothing_is_lost(caplog, meta):
    with caplog.at_level(logging.WARNING):
        encode_request(scrapy.Request("https://shop.example/d", meta=meta), None)
    assert warnings(caplog) == []
