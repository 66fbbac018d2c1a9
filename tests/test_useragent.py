"""The optional User-Agent pool."""

from __future__ import annotations

import pytest
from scrapy import Request
from scrapy.exceptions import NotConfigured
from scrapy.utils.test import get_crawler

from scrapy_ha.config.validate import ConfigError
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


def test_a_bad_list_names_the_setting():
    with pytest.raises(ConfigError, match="HA_USER_AGENTS"):
        UserAgentPoolMiddleware.from_crawler(
            get_crawler(settings_dict={"HA_USER_AGENTS": ["", "x"]})
        )
