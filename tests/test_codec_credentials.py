"""Per-request credentials are stored (another worker redoes the request) but never printed."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler
from w3lib.http import basic_auth_header

from scrapy_ha.codec import decode_request, encode_request, mask_payload, strip_credentials
from scrapy_ha.deadletters.dlq import DeadLetterQueue
from tests.spiders import FaultSpider
from tests.test_cli import crawl, scrapy_ha
from tests.test_dashboard_api import ENCODED, SECRETS, CredentialSpider

SECRET = "s3cret-pw"


class AuthSpider(scrapy.Spider):
    """Logs in per request to a page that is gone (dead-lettered)."""

    name = "authpass"
    http_user = "spider-user"
    http_pass = "spider-level-pw"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base_url = base_url

    async def start(self) -> Any:
        meta = {"http_user": "alice", "http_pass": SECRET, "http_auth_domain": None}
        yield scrapy.Request(f"{self.base_url}/status/404", meta=meta, errback=self.on_error)

    def on_error(self, failure: Any) -> None:
        pass


def test_the_spider_attributes_are_never_stored_the_meta_is():
    spider = AuthSpider()
    request = scrapy.Request("http://x/", meta={"http_pass": SECRET})
    payload = encode_request(request, spider)
    assert b"spider-level-pw" not in payload and SECRET.encode() in payload


def test_mask_payload_hides_http_pass_also_in_nested_requests_and_other_meta_forms():
    doc = {
        "u": "http://x/",
        "mt": {
            "http_user": "a",
            "http_pass": SECRET,
            "next": {"__r": {"u": "http://y/", "mt": {"http_pass": SECRET}}},
        },
        "k": {"__d": [[1, 2]]},
    }
    shown = json.dumps(mask_payload(doc))
    assert SECRET not in shown and shown.count('"***"') == 2 and '"http_user": "a"' in shown
    tagged = {"u": "http://x/", "mt": {"__d": [["http_pass", SECRET], [1, "one"]]}}
    assert SECRET not in json.dumps(mask_payload(tagged))
    assert doc["mt"]["http_pass"] == SECRET  # a copy: the stored request is untouched


@deferred_f_from_coro_f
async def test_dlq_show_masks_http_pass(redis_url, site):
    await crawl(AuthSpider, redis_url, site)
    async with DeadLetterQueue.from_url(redis_url, "authpass") as dlq:
        (entry,) = await dlq.entries()
    assert entry.request["mt"]["http_pass"] == SECRET  # stored: another worker needs it
    out = scrapy_ha("--redis-url", redis_url, "dlq", "show", "authpass", entry.id).stdout
    assert SECRET not in out
    shown = json.loads(out)["request"]["mt"]
    assert shown["http_pass"] == "***" and shown["http_user"] == "alice"


class EveryCredentialSpider(CredentialSpider):
    """The dashboard test's request with every kind of credential, its URL carrying an API
    key too."""

    name = "allcreds"

    async def start(self) -> Any:
        async for request in super().start():
            yield request.replace(url=f"{request.url}?api_key=query-S6&page=2")


#: Every secret the spider gives, as given and as the payload stores a header (base64).
LEAKS = (*SECRETS, *ENCODED, "query-S6")


@deferred_f_from_coro_f
async def test_no_dlq_command_prints_a_credential(redis_url, redis_client, site, proxy_factory):
    proxy_url = proxy_factory().url.replace("http://", "http://bob:proxy-S4@")
    await crawl(EveryCredentialSpider, redis_url, site, proxy=proxy_url)
    stored = b"".join(redis_client.hvals("ha:{allcreds}:payload"))
    assert b"query-S6" in stored  # the secrets are there to leak: the next worker needs them
    async with DeadLetterQueue.from_url(redis_url, "allcreds") as dlq:
        (entry,) = await dlq.entries()
    outputs = {
        cmd: scrapy_ha("--redis-url", redis_url, "dlq", *cmd.split(), "allcreds", *ids).stdout
        for cmd, ids in (("show", [entry.id]), ("export", []), ("list", []))
    }
    for cmd, out in outputs.items():
        leaked = [s for s in LEAKS if s in out]
        assert not leaked, f"dlq {cmd} prints {leaked}"
    shown = json.loads(outputs["show"])["request"]
    assert shown["h"]["Authorization"] == "***"  # the spider's own header, stored
    assert shown["c"] == {"jar": "***"} and shown["mt"]["http_user"] == "alice"
    assert shown["u"].endswith("?api_key=***&page=2")
    assert json.loads(outputs["export"])["url"].endswith("?api_key=***&page=2")


#: Scrapy's HTTPAUTH_* settings: HttpAuthMiddleware adds their header to every request of
#: the domain (issue 36 item 3).
HTTPAUTH = {"HTTPAUTH_USER": "settings-user", "HTTPAUTH_PASS": "httpauth-S1"}
HTTPAUTH_HEADER = basic_auth_header("settings-user", "httpauth-S1")


@deferred_f_from_coro_f
async def test_the_authorization_httpauth_settings_add_is_never_stored(
    redis_url, redis_client, site
):
    # the middleware compares the domain with the URL's host and port
    domain = site.url.split("://", 1)[1]
    settings = {**HTTPAUTH, "HTTPAUTH_DOMAIN": domain, "HA_RETRY_TIMES": 1}
    paths = ("/status/404", "/flaky/1?fail=9&status=503")  # gone, then retried and dead
    crawler = await crawl(FaultSpider, redis_url, site, paths=paths, settings=settings)
    assert crawler.stats.get_value("ha/retry/server") == 1  # stored once as a retry too
    stored = b"".join(redis_client.hvals("ha:{faults}:payload"))
    assert len(redis_client.hkeys("ha:{faults}:payload")) == 2
    assert base64.b64encode(HTTPAUTH_HEADER) not in stored and b"Authorization" not in stored


def httpauth_spider(domain: str | None, **settings: Any) -> scrapy.Spider:
    crawler = get_crawler(scrapy.Spider, {**HTTPAUTH, "HTTPAUTH_DOMAIN": domain, **settings})
    return scrapy.Spider.from_crawler(crawler, name="s")


def stored_headers(request: scrapy.Request, spider: scrapy.Spider) -> dict[str, Any]:
    headers = decode_request(encode_request(request, spider), spider).headers
    return {k.decode(): v for k, v in headers.items()}


def test_httpauth_settings_are_read_as_the_middleware_reads_them():
    spider = httpauth_spider("example.com")
    added = {"Authorization": HTTPAUTH_HEADER}
    # what the middleware adds within its domain: not stored
    assert stored_headers(scrapy.Request("https://example.com/a", headers=added), spider) == {}
    assert stored_headers(scrapy.Request("https://www.example.com/", headers=added), spider) == {}
    # out of its domain it adds nothing: a header there is the spider's own, kept
    other = scrapy.Request("https://other.example/", headers=added)
    assert "Authorization" in stored_headers(other, spider)
    # the request's own credentials win over the settings (the middleware's order)
    meta = {"http_user": "alice", "http_pass": "pw"}
    own = scrapy.Request("https://example.com/", headers=added, meta=meta)
    assert "Authorization" in stored_headers(own, spider)
    # HttpAuthMiddleware switched off: nobody adds it again, so it is kept
    off = httpauth_spider(
        None,
        DOWNLOADER_MIDDLEWARES={"scrapy.downloadermiddlewares.httpauth.HttpAuthMiddleware": None},
    )
    kept = scrapy.Request("https://example.com/", headers=added)
    assert "Authorization" in stored_headers(kept, off)


@pytest.mark.parametrize(
    ("proxy", "stored"),
    [
        ("http://user:pw@10.0.0.1:8080", "http://10.0.0.1:8080"),
        ("http://user:pa/s3cret@10.0.0.1:8080", "http://10.0.0.1:8080"),
        ("http://user:Ab?Cd#s3cret@10.0.0.1:8080", "http://10.0.0.1:8080"),
        ("http://10.0.0.1:8080", "http://10.0.0.1:8080"),
    ],
)
def test_a_proxy_password_never_reaches_redis_whatever_its_characters(proxy, stored):
    spider = FaultSpider()
    request = scrapy.Request("http://shop.example/", meta={"proxy": proxy})
    assert strip_credentials(proxy) == stored
    assert decode_request(encode_request(request, spider), spider).meta["proxy"] == stored
