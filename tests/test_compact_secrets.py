"""The crawl's compaction dictionary (``ha:{S}:dict``) is trained from its first requests:
it holds none of the secrets those requests keep (an Authorization header the spider set,
an API key in the URL), which stay in their payloads alone and go with them, however long
the dictionary lives (the whole crawl, past its finish)."""

from __future__ import annotations

from typing import Any

import redis.asyncio
from scrapy import Request
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.codec import encode_request
from scrapy_ha.keys import Keys
from scrapy_ha.store.dictionary import SAMPLES, Compactor, Dictionaries
from tests.spiders import CatalogueSpider
from tests.test_compact_payloads import trained_crawl

TOKEN = "tok-8f3c1e-SECRET"
API_KEY = "key-5b7d20-SECRET"


class KeyedSpider(CatalogueSpider):
    """The catalogue, every request of it with a bearer token and an API key of its own."""

    name = "keyed"

    async def start(self) -> Any:
        async for request in super().start():
            yield keyed(request)

    def parse(self, response: Any) -> Any:
        for request in super().parse(response):
            yield keyed(request)


def keyed(request: Request) -> Request:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    return request.replace(url=f"{request.url}?api_key={API_KEY}", headers=headers)


def every_value(client: Any, key: bytes) -> bytes:
    """A key's content, whatever its type (its serialized form: DUMP)."""
    if client.type(key) == b"hash":  # each field whole (DUMP may compress a large value)
        return b"\n".join(x for pair in client.hgetall(key).items() for x in pair)
    return client.dump(key) or b""


def shop(n: int) -> bytes:
    """A request of a shop's catalogue with its token and key, as a worker stores it."""
    url = f"https://www.example-shop.com/catalogue/category/books_{n % 50}/item-{n}/index.html"
    return encode_request(keyed(Request(url)), None)


@deferred_f_from_coro_f
async def test_the_dictionary_holds_no_secret_of_the_requests_it_is_trained_from(redis_url):
    client = redis.asyncio.Redis.from_url(redis_url)
    keys = Keys("ha", "dict")
    compactor = Compactor()
    for n in range(SAMPLES):
        compactor.sample(shop(n))
    try:
        await compactor.settle(Dictionaries(client, keys))
        stored = await client.hgetall(keys.dictionaries)
    finally:
        await client.aclose()
    assert compactor.dictionary is not None and compactor.dictionary.data in stored.values()
    holding = [k for k, v in stored.items() if TOKEN.encode() in v or API_KEY.encode() in v]
    assert not holding, f"the dictionary holds the requests' secrets: {stored}"
    # and it still compacts such a request (its URL, its fields) to a fraction of its size
    frame, plain = compactor.pending(shop(10_000)), shop(10_000)
    assert len(frame) < len(plain) / 2, (len(frame), len(plain))


@deferred_f_from_coro_f
async def test_a_finished_crawl_leaves_no_secret_of_its_requests_in_redis(
    redis_url, redis_client, site_factory
):
    site = site_factory("--pages", "20", "--per-page", "12")  # 260 requests: 128 train
    crawler = get_crawler(KeyedSpider, trained_crawl(redis_url))
    await crawler.crawl_async(base_url=site.url)
    assert sorted(i["id"] for i in crawler.spider.items) == list(range(1, 241))
    keys = Keys("ha", "keyed")
    assert redis_client.hget(keys.dictionaries, "current"), "no dictionary: nothing compacted"
    held = {key: every_value(redis_client, key) for key in redis_client.scan_iter(count=1000)}
    holding = [k.decode() for k, v in held.items() if TOKEN.encode() in v or API_KEY.encode() in v]
    assert not holding, f"the finished crawl left its secrets in {holding}"
