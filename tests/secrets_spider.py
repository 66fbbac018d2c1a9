"""A spider that gives every kind of secret a Scrapy project gives (``scrapy runspider`` it).

Each request goes to a page that fails for good (dead-lettered), but one that waits in the
delayed set; the secrets are the values of :data:`SECRETS`. ``StatsFile`` (an extension)
writes the crawl's stats as they are, unmasked, to ``SECRETS_STATS_FILE`` when it closes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import scrapy
from scrapy import signals
from scrapy.http import FormRequest, JsonRequest

#: Every secret the crawl is given, by where it comes from. Only those a worker needs to redo
#: a request (:data:`KEPT`) may be kept, and only in the request's payload or the cookie jar.
SECRETS = {
    "redis_password": "redisPW-S01",
    "proxy_password": "proxyPW-S02",
    "httpauth_settings": "httpauthPW-S03",
    "spider_authorization": "bearer-S04",
    "meta_http_pass": "metaPW-S05",
    "cookie_header": "cookieHdr-S06",
    "cookie_jar": "jarVal-S07",
    "query_snake": "qApiKey-S08",
    "query_camel": "qAccess-S09",
    "query_camel_secret": "qClient-S10",
    "query_kebab": "qKebab-S11",
    "x_api_key": "xApiKey-S12",
    "form_password": "formPW-S13",
    "json_password": "jsonPW-S14",
    "json_nested_token": "jsonTok-S15",
    "archive_password": "archPW-S16",
    "archive_query_password": "archQ-S17",
    "webhook_password": "hookPW-S18",
    "webhook_path_token": "hookTok-S19",
    "webhook_query_token": "hookQ-S20",
}
#: Kept in Redis because the request cannot be redone without them (the spider set them on
#: the request itself; the middlewares do not add them again).
KEPT = {
    "spider_authorization",
    "meta_http_pass",
    "cookie_header",
    "cookie_jar",
    "query_snake",
    "query_camel",
    "query_camel_secret",
    "query_kebab",
    "x_api_key",
    "form_password",
    "json_password",
    "json_nested_token",
}
S = SECRETS


class SecretsSpider(scrapy.Spider):
    name = "secrets"
    custom_settings = {  # noqa: RUF012 (Scrapy's own attribute)
        "ADDONS": {"scrapy_ha.Addon": 0},
        "EXTENSIONS": {"tests.secrets_spider.StatsFile": 0},
        "HTTPAUTH_USER": "settings-user",  # HTTPAUTH_DOMAIN: the site's host:port, given
    }

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base_url = base_url

    async def start(self) -> Any:
        for request in self.requests():
            yield request.replace(errback=self.on_error)

    def requests(self) -> list[scrapy.Request]:
        gone = f"{self.base_url}/status/404"
        return [
            scrapy.Request(
                f"{gone}?api_key={S['query_snake']}&accessToken={S['query_camel']}&page=1",
                headers={"Authorization": f"Bearer {S['spider_authorization']}"},
            ),
            scrapy.Request(
                f"{gone}?clientSecret={S['query_camel_secret']}&private-key={S['query_kebab']}",
                headers={"X-Api-Key": S["x_api_key"]},
                cookies={"jar": S["cookie_jar"]},
            ),
            scrapy.Request(
                f"{gone}?meta",
                meta={"http_user": "alice", "http_pass": S["meta_http_pass"]},
            ),
            scrapy.Request(
                f"{gone}?own-cookie",
                headers={"Cookie": f"sess={S['cookie_header']}"},
                meta={"dont_merge_cookies": True},
            ),
            FormRequest(f"{gone}?form", formdata={"user": "u", "password": S["form_password"]}),
            JsonRequest(
                f"{gone}?json",
                data={"user": "u", "password": S["json_password"], "auth": {"apiToken": "x"}},
                cb_kwargs={"session": {"authToken": S["json_nested_token"]}},
            ),
            # fails with 500 and waits in the delayed set (HA_RETRY_POLICIES gives 10 min)
            scrapy.Request(f"{self.base_url}/status/500?settings-auth"),
        ]

    def parse(self, response: Any, **kwargs: Any) -> None:
        pass

    def on_error(self, failure: Any) -> None:
        pass


class StatsFile:
    """Writes the crawl's stats, as they are, to SECRETS_STATS_FILE when the spider closes."""

    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.path = Path(crawler.settings.get("SECRETS_STATS_FILE"))
        crawler.signals.connect(self.closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Any) -> StatsFile:
        return cls(crawler)

    def closed(self, spider: Any) -> None:
        stats = self.crawler.stats.get_stats()
        self.path.write_text(json.dumps(stats, default=str))
