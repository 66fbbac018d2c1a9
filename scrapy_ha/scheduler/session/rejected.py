"""Redis refusing the session's commands, said once a minute while it lasts, not at every retry.

A round that Redis refuses (an error reply other than a key of another type, which is set
aside: :meth:`.Ends.bad_data`) is retried a second later, and was said at ERROR at every
retry: a Redis over its ``maxmemory`` wrote an ERROR a second for as long as it stayed full,
and did not say which server of a Redis Cluster it was (a QA run). Now the first refusal is
said, then one a minute while the same refusal goes on, with how many were not said. (Not
a word when they end: a full Redis still runs the scripts that write nothing, so a round
that went through does not say the refusals ended.) A refusal for memory
(``OutOfMemoryError``) names the primaries at or over their ``maxmemory`` with their
figures, and what to do. Each refusal counts ``ha/redis_refused``. Nothing is lost
meanwhile: the refused command wrote nothing, and what it carried is sent again.
"""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING, Any

import redis

from scrapy_ha.store.health import over_maxmemory

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.statscollectors import StatsCollector

__all__ = ["SAY_EVERY", "Rejections"]

logger = logging.getLogger(__name__)

#: Seconds between two ERRORs of the same refusal while it lasts.
SAY_EVERY = 60.0
#: Kinds of refusals remembered at most.
MOST_KINDS = 64
#: Where Redis names the script or function that was refused: not part of what it is.
_SCRIPT = re.compile(r"\s*script: \w+, on @user_(?:script|function):\d+\.?$")


class Rejections:
    """What this worker said of Redis's refusals (see the module docstring)."""

    def __init__(
        self,
        stats: StatsCollector,
        redis_url: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stats = stats
        #: the crawl's Redis as logs name it (``display_url``: password masked)
        self.redis = f"Redis at {redis_url}" if redis_url else "Redis"
        self.clock = clock
        # each refusal (its text, without the script's name: scripts take turns being
        # refused) -> when it was said last, and how many times since
        self._said: dict[str, tuple[float, int]] = {}

    async def refused(self, exc: Exception, client: Any) -> None:
        """Redis refused a command of a round (*client*: the crawl's, to read its memory)."""
        self.stats.inc_value("ha/redis_refused")
        full = isinstance(exc, redis.exceptions.OutOfMemoryError)  # (one, whatever refused)
        what = "full" if full else f"{type(exc).__name__} {_SCRIPT.sub('', str(exc))}"
        now = self.clock()
        at, since = self._said.get(what, (None, 0))
        if at is not None and now - at < SAY_EVERY:
            self._said[what] = (at, since + 1)
            return
        if len(self._said) >= MOST_KINDS:
            self._said.clear()  # (errors of every kind: said again, none kept for ever)
        self._said[what] = (now, 0)
        again = f" ({since} more since it was last said)" if since else ""
        if full:
            logger.error(
                "%s and refuses scrapy-ha's writes%s: this worker can neither store, lease "
                "nor acknowledge requests (nothing is lost; it retries every second, said "
                "again once a minute while it lasts); raise maxmemory (CONFIG SET maxmemory) "
                "or free memory (scrapy-ha dlq purge, flush a finished crawl)",
                await _full(client, self.redis),
                again,
            )
        else:
            logger.error(
                "%s refused a scrapy-ha command%s (%s); retrying every second, said again "
                "once a minute while it lasts",
                self.redis,
                again,
                exc,
            )


async def _full(client: Any, redis_at: str) -> str:
    """Which servers are over their maxmemory, as the start of a sentence."""
    try:
        full = await over_maxmemory(client)
    except (redis.exceptions.RedisError, OSError) as exc:
        return f"{redis_at} is over its maxmemory (its memory could not be read: {exc})"
    if not full:  # freed meanwhile, or INFO not allowed to this user
        return f"{redis_at} is over its maxmemory"
    return f"{redis_at} is over its maxmemory ({'; '.join(full)})"
