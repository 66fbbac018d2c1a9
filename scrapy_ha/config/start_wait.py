"""How long a long-running process waits for Redis at start: a worker (read with the rest
of :class:`~scrapy_ha.config.scheduler.SchedulerConfig`) and the item consumer
(``scrapy-ha items``, :class:`StartWaitConfig`) read the same settings, with the same
defaults (see :mod:`scrapy_ha.store.start_wait`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy_ha.config import validate as check
from scrapy_ha.config.scheduler import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_RECONNECT_MAX_DELAY,
    DEFAULT_START_TIMEOUT,
)

if TYPE_CHECKING:
    from typing import Self

    from scrapy.settings import BaseSettings

__all__ = ["StartWaitConfig"]


@dataclass(frozen=True)
class StartWaitConfig:
    """``HA_CONNECT_TIMEOUT`` (each attempt), ``HA_START_TIMEOUT`` (the whole wait; 0: one
    attempt, no waiting), ``HA_RECONNECT_MAX_DELAY`` (the longest pause between two)."""

    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    start_timeout: float = DEFAULT_START_TIMEOUT
    reconnect_max_delay: float = DEFAULT_RECONNECT_MAX_DELAY

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        return cls(
            connect_timeout=check.seconds(settings, "HA_CONNECT_TIMEOUT", DEFAULT_CONNECT_TIMEOUT),
            start_timeout=check.seconds(
                settings, "HA_START_TIMEOUT", DEFAULT_START_TIMEOUT, zero=True
            ),
            reconnect_max_delay=check.seconds(
                settings, "HA_RECONNECT_MAX_DELAY", DEFAULT_RECONNECT_MAX_DELAY
            ),
        )
