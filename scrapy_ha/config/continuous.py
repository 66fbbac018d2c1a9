"""The settings of continuous crawling: how long a seen URL stays seen
(``HA_DUPEFILTER_TTL``), and revisits (``HA_REVISIT``...)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy_ha.config import validate as check
from scrapy_ha.config.validate import ConfigError

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = ["DEFAULT_DUPEFILTER_TTL", "MIN_DUPEFILTER_TTL", "check_dupefilter_age", "dupefilter_ttl"]

#: A URL seen once is seen for the life of the crawl, as with Scrapy's and scrapy-redis's
#: dupefilters (0: no age).
DEFAULT_DUPEFILTER_TTL = 0.0
#: The shortest age: a second. The time slices of lua/lib/aged.lua last an eighth of it,
#: and the server's clock is read in milliseconds.
MIN_DUPEFILTER_TTL = 1.0


def dupefilter_ttl(settings: BaseSettings) -> float:
    """``HA_DUPEFILTER_TTL``: seconds after which a URL seen before may be crawled again
    when linked again (0: never)."""
    ttl = check.seconds(settings, "HA_DUPEFILTER_TTL", DEFAULT_DUPEFILTER_TTL, zero=True)
    if 0 < ttl < MIN_DUPEFILTER_TTL:
        raise ConfigError(
            f"HA_DUPEFILTER_TTL={ttl!r} must be 0 (seen for ever) or {MIN_DUPEFILTER_TTL:g} "
            "second or more"
        )
    return ttl


def check_dupefilter_age(ttl: float, dupefilter: str) -> None:
    """A TTL needs the exact set: a Bloom filter cannot forget a URL (``HA_DUPEFILTER``)."""
    if ttl and dupefilter == "bloom":
        raise ConfigError(
            f"HA_DUPEFILTER_TTL={ttl:g} cannot be used with HA_DUPEFILTER='bloom': a Bloom "
            "filter cannot forget a URL, so none would be new again after the TTL; keep "
            "HA_DUPEFILTER='set' (the exact set, kept in time slices with a TTL), or set "
            "HA_DUPEFILTER_TTL=0"
        )
