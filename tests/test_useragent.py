"""The optional User-Agent pool."""

from __future__ import annotations

import json

import pytest
from scrapy import Request
from scrapy.exceptions import NotConfigured
from scrapy.utils.test import get_crawler

from scrapy_ha.config.startup import start_refused
from scrapy_ha.middlewares.useragent import UserAgentPoolMiddleware

AGENTS = ["Mozilla/5.0 (X11; Linux x86_64) A", "Mozilla/5.0 (Macintosh) B"]


def test_off_by_default():
    with pytest.raises(NotConfigured):
        UserAgentPoolMiddleware.from_crawler(get_crawler())


def test_every_agent_is_used_and_a_request_s_own_agent_is_kept():
    mw = UserAgentPoolMiddleware.from_crawler(get_crawler(settings_dict={"HA_USER_AGENTS": AGENTS}))
    seen = set()
    for _ in range(200):
        request = Request("https://example.com")
        mw.process_request(request)
        seen.add(request.headers[b"User-Agent"].decode())
    assert seen == set(AGENTS)
    own = Request("https://example.com", headers={"User-Agent": "mine"})
    mw.process_request(own)
    assert own.headers[b"User-Agent"] == b"mine"


def refused(value: object, caplog: pytest.LogCaptureFixture) -> str:
    """What the middleware said of *value*: it is left out, and the crawl's start refused."""
    crawler = get_crawler(settings_dict={"HA_USER_AGENTS": value})
    with pytest.raises(NotConfigured):
        UserAgentPoolMiddleware.from_crawler(crawler)
    assert start_refused(crawler)
    return caplog.text


def test_a_bad_list_names_the_setting(caplog):
    assert "scrapy-ha cannot start: HA_USER_AGENTS" in refused(["", "x"], caplog)


def test_every_attempt_picks_again_even_through_redis():
    from scrapy_ha.codec import decode_request, drop_set_again, encode_request
    from tests.spiders import FaultSpider

    agents = [f"Agent-{n}" for n in range(10)]
    crawler = get_crawler(FaultSpider, settings_dict={"HA_USER_AGENTS": agents})
    spider = FaultSpider()
    spider.crawler = crawler
    mw = UserAgentPoolMiddleware.from_crawler(crawler)
    request = Request("https://example.com", callback=spider.parse)
    seen = set()
    for _ in range(40):  # each retry stored in Redis and read back, as a worker does
        mw.process_request(request)
        seen.add(request.headers[b"User-Agent"].decode())
        request = decode_request(encode_request(request.replace(), spider), spider)
    assert len(seen) > 1  # before: the first pick, for every retry
    request.meta["_ha_own_headers"] = ()  # as the scheduler hands it out: no header
    mw.process_request(request)
    # the pool's pick does not go back to Redis with a retry or a revisit (a worker's
    # InFlight.end): the next attempt picks again, or gets the crawl's USER_AGENT if the
    # pool was switched off meanwhile (before: the pick, for ever)
    drop_set_again(request)
    assert b"User-Agent" not in decode_request(encode_request(request, spider), spider).headers
    own = Request("https://example.com", headers={"User-Agent": "mine"}, callback=spider.parse)
    own = decode_request(encode_request(own, spider), spider)
    mw.process_request(own)
    assert own.headers[b"User-Agent"] == b"mine"


def test_a_pool_switched_off_then_on_again_picks_again():
    """A review's finding on the first version, which dropped a header by its value: the
    agent a worker without the pool set (its USER_AGENT) differed from the pool's last pick,
    was stored, and taken by the pool for the request's own for ever after."""
    from scrapy_ha.codec import drop_set_again

    class Plain:  # Scrapy's UserAgentMiddleware with USER_AGENT = "default-B"
        def process_request(self, request: Request) -> None:
            request.headers.setdefault(b"User-Agent", b"default-B")

    agents = [f"pool-{n}" for n in range(3)]
    pool = UserAgentPoolMiddleware.from_crawler(
        get_crawler(settings_dict={"HA_USER_AGENTS": agents})
    )
    plain = Plain()
    request = Request("https://example.com")
    for middlewares in ([pool, plain], [plain], [pool, plain]):  # three workers in turn
        request.meta["_ha_own_headers"] = ()  # handed out by the scheduler, no header
        for middleware in middlewares:
            middleware.process_request(request)
        sent = request.headers[b"User-Agent"]
        drop_set_again(request)  # back to Redis
    assert sent.startswith(b"pool-"), sent  # (before: default-B, for ever)


UA = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0"


@pytest.mark.parametrize(
    ("given", "agents"),
    [
        (UA, [UA]),
        (f"{UA}\nAgent B\n\n", [UA, "Agent B"]),
        (json.dumps([UA, "Agent B"]), [UA, "Agent B"]),
    ],
    ids=["one-with-a-comma", "one-per-line", "json"],
)
def test_agents_given_as_text_are_never_split_at_commas(given, agents):
    mw = UserAgentPoolMiddleware.from_crawler(get_crawler(settings_dict={"HA_USER_AGENTS": given}))
    assert mw.agents == agents


@pytest.mark.parametrize("given", ["Agent A,Agent B", f"{UA}, Mozilla/5.0 (Mac)", "[not json"])
def test_ambiguous_text_is_refused_naming_the_setting(given, caplog):
    assert "scrapy-ha cannot start: HA_USER_AGENTS" in refused(given, caplog)


def test_an_agent_of_the_pool_beyond_latin_1_is_picked_again_at_each_attempt():
    """Review: the header (UTF-8 bytes) read as Latin-1 never equalled the pool's pick, so
    such an agent was taken for the request's own and kept for every retry."""
    agents = [f"Agent/{n} ü" for n in range(8)]
    mw = UserAgentPoolMiddleware.from_crawler(get_crawler(settings_dict={"HA_USER_AGENTS": agents}))
    request = Request("https://example.com")
    seen = set()
    for _ in range(40):
        mw.process_request(request)  # each attempt of the same request (its retries)
        seen.add(request.headers[b"User-Agent"])
    assert len(seen) > 1
