"""The dead-letter queue's settings, validated: its retention (entries and age) and the
size past which a worker warns. The archive's and the alert's own settings are read beside
them (:mod:`scrapy_ha.deadletters.archive`, :mod:`scrapy_ha.deadletters.alerts`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy_ha.config import validate as check
from scrapy_ha.config.validate import ConfigError

if TYPE_CHECKING:
    from typing import Self

    from scrapy.settings import BaseSettings

__all__ = [
    "DEFAULT_DLQ_MAX_AGE_MS",
    "DEFAULT_DLQ_MAX_ENTRIES",
    "DEFAULT_DLQ_WARN_THRESHOLD",
    "NO_AGE_LIMIT_MS",
    "DeadLetterConfig",
]

#: Dead-letter retention: entries kept at most, and for at most this long (30 days).
DEFAULT_DLQ_MAX_ENTRIES = 100_000
DEFAULT_DLQ_MAX_AGE_MS = 30 * 24 * 3600 * 1000
#: Warn once when the dead-letter queue passes this many entries: a crawl that dead-letters
#: this much has a cause worth a look (a ban, a site change).
DEFAULT_DLQ_WARN_THRESHOLD = 1000
#: The age limit (ms) sent to Redis for ``HA_DLQ_MAX_AGE = float("inf")`` (no age limit) and
#: any age longer than it: 2^53 ms (285,000 years), the largest integer a Lua number holds
#: exactly; the server's clock minus it is below every entry's time.
NO_AGE_LIMIT_MS = 2**53


@dataclass(frozen=True)
class DeadLetterConfig:
    """Retention of the dead-letter queue (trimmed at each dead letter) and its warning."""

    max_entries: int = DEFAULT_DLQ_MAX_ENTRIES
    max_age: float = DEFAULT_DLQ_MAX_AGE_MS / 1000
    warn_threshold: int = DEFAULT_DLQ_WARN_THRESHOLD

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        return cls(
            # 0 entries or 0 seconds: keep no dead letter (each is trimmed as it arrives)
            max_entries=check.whole(
                settings, "HA_DLQ_MAX_ENTRIES", DEFAULT_DLQ_MAX_ENTRIES, minimum=0
            ),
            max_age=_max_age(settings),
            warn_threshold=check.whole(
                settings, "HA_DLQ_WARN_THRESHOLD", DEFAULT_DLQ_WARN_THRESHOLD, minimum=0
            ),
        )

    @property
    def max_age_ms(self) -> int:
        """The age limit Redis applies (ms): ``inf``, or an age past 285,000 years, is none."""
        return int(min(self.max_age * 1000, NO_AGE_LIMIT_MS))


def _max_age(settings: BaseSettings) -> float:
    """HA_DLQ_MAX_AGE: seconds, 0 or more; ``float("inf")`` keeps dead letters whatever their
    age (only HA_DLQ_MAX_ENTRIES trims them). NaN is refused (it would compare false with
    every age: no limit, by accident)."""
    default = DEFAULT_DLQ_MAX_AGE_MS / 1000
    try:
        return check.seconds(settings, "HA_DLQ_MAX_AGE", default, zero=True, most=math.inf)
    except ConfigError as exc:  # NaN: it would compare false with every age
        raise ConfigError(f"{exc}; float('inf') keeps dead letters whatever their age") from None
