"""An optional User-Agent pool (some sites ban one agent seen too often): off by default.

``HA_USER_AGENTS = ["Mozilla/5.0 ...", ...]`` picks one at random for every attempt of a
request that has no User-Agent of its own (a retry gets a new pick). For pacing, use
Scrapy's own AutoThrottle (``AUTOTHROTTLE_ENABLED``) and ``DOWNLOAD_DELAY`` (randomized by
``DOWNLOAD_DELAY_JITTER``) rather than another middleware.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from scrapy.exceptions import NotConfigured

from scrapy_ha import metakeys
from scrapy_ha.config.middlewares import UserAgentConfig
from scrapy_ha.config.startup import configured

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request
    from scrapy.crawler import Crawler


__all__ = ["UserAgentPoolMiddleware"]


class UserAgentPoolMiddleware:
    """Downloader middleware at 400, before Scrapy's UserAgentMiddleware (500)."""

    def __init__(self, agents: list[str] | tuple[str, ...]) -> None:
        self.agents = list(agents)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = configured(crawler, UserAgentConfig.from_settings)
        if not config.agents:
            raise NotConfigured  # no pool configured: silent (Scrapy warns if given a reason)
        return cls(config.agents)

    def process_request(self, request: Request) -> None:
        """Pick an agent for every attempt of a request without one of its own: a retry
        (stored with its last agent) gets a new pick, ``meta["ha_user_agent"]`` says which
        agent the pool put there."""
        current = request.headers.get(b"User-Agent")
        picked = request.meta.get(metakeys.USER_AGENT)
        if current is not None and (picked is None or current != picked.encode()):
            return  # the request's own
        agent = random.choice(self.agents)
        request.headers[b"User-Agent"] = agent
        request.meta[metakeys.USER_AGENT] = agent
