"""A request stored again after a download (a revisit, a retry, a dead letter) keeps none
of the headers the downloader middlewares put on it during that attempt
(codec/credentials.py ``drop_set_again``): the next download sets them again from the
settings of the worker that does it; the spider's own are kept, whatever their value.
Before, a revisit kept its first download's User-Agent, Accept, Accept-Language and
Accept-Encoding for ever: a new ``USER_AGENT`` (or agent pool) never reached it."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.codec import decode_request
from tests import backqueues
from tests import test_revisit_conditional as conditional
from tests.test_revisit_conditional import KEYS, PagesSpider, fetches, get, settings, stop, until

if TYPE_CHECKING:
    import scrapy

pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")

changing_site = conditional.changing_site  # the fixture


class AgentsSpider(PagesSpider):
    """Records the User-Agent each page's download went out with; page 2 has its own."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.agents: dict[str, bytes] = {}

    async def start(self) -> Any:
        async for request in super().start():
            if request.url.endswith("/p/2"):  # the crawl's USER_AGENT, but the spider's own
                request.headers[b"User-Agent"] = b"agent-A"
            yield request

    def parse(self, response: Any) -> None:
        self.agents[response.url[-1]] = response.request.headers.get(b"User-Agent")


def stored(redis_client: Any, spider: scrapy.Spider) -> list[scrapy.Request]:
    """The crawl's requests as stored: delayed (their payloads) or pending (back queues)."""
    payloads = list(redis_client.hvals(KEYS.payload))
    payloads += [payload for _, payload in backqueues.pending(redis_client, KEYS)]
    return [decode_request(payload, spider) for payload in payloads]


@deferred_f_from_coro_f
async def test_a_revisit_gets_the_crawls_current_user_agent(redis_url, redis_client, changing_site):
    base = changing_site("--static", "--no-conditional")  # each visit a 200: seen by parse
    first = get_crawler(AgentsSpider, settings(redis_url, USER_AGENT="agent-A"))
    crawling = asyncio.ensure_future(first.crawl_async(base_url=base))
    await until(lambda: fetches(base, 0) >= 2, "a revisit of page 0", crawling)
    await stop(crawling, redis_client)
    requests = stored(redis_client, first.spider)
    assert len(requests) == 3, requests
    # before: User-Agent, Accept, Accept-Language, Accept-Encoding and the validators (the
    # revisits' state holds those): what the downloader middlewares set at each attempt
    for request in requests:
        own = {b"User-Agent"} if request.url.endswith("/p/2") else set()
        assert set(request.headers) == own, request.headers
        assert not own or request.headers[b"User-Agent"] == b"agent-A"  # the spider's: kept
    for page in range(3):  # changed: their next visits reach parse
        await asyncio.to_thread(get, f"{base}/_change?page={page}")
    second = get_crawler(AgentsSpider, settings(redis_url, USER_AGENT="agent-B"))
    crawling = asyncio.ensure_future(second.crawl_async(base_url=base))
    seen = lambda: len(getattr(second.spider, "agents", ())) >= 3  # noqa: E731
    await until(seen, "the changed pages", crawling)
    await stop(crawling, redis_client)
    assert second.spider.agents == {"0": b"agent-B", "1": b"agent-B", "2": b"agent-A"}
