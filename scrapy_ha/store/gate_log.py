"""The crawl's gates as one worker learns them: a 429 with Retry-After closes its domain for
every worker (``gate.lua``), and each sync returns only the gates changed since the number
of the last change the worker saw (``sync.lua``, KEYS[27]). Before, every call read and
returned every closed gate: at 1,000 gates, 5.8 times a round's Redis instructions."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy_ha.store.wire import SyncResult


class GateLog:
    """One shard's gate number and the changes its replies brought that the worker has not
    taken yet: every sync of the shard feeds it (an ack-only call too), the worker's round
    takes them (:meth:`take`). A gate is kept as the ``time.monotonic()`` it opens, read by
    the clock of the reply that brought it (a round's own reply may carry no clock: a
    sharded round that called no shard)."""

    def __init__(self) -> None:
        #: the number of the last gate change seen (0: none): sent with every sync
        self.number = 0
        self._news: dict[str, float] = {}
        self._every = False

    def note(self, since: int, result: SyncResult) -> None:
        """Keep the gates of the reply of a call that sent *since*."""
        now = time.monotonic()
        gates = {d: now + (until - result.now_ms) / 1000 for d, until in result.gates.items()}
        if result.gate_number < since:
            # the log is behind the number sent: lost with its Redis (a restart without
            # persistence, a flush, garbage), so the reply holds every gate closed now
            self._news, self._every = gates, True
            self.number = result.gate_number
            return
        news = self._news
        for domain, opens in gates.items():
            if opens > news.get(domain, 0):
                news[domain] = opens
        self.number = max(self.number, result.gate_number)

    def take(self) -> tuple[dict[str, float], bool]:
        """The gates learnt since the last take (domain -> ``time.monotonic()`` it opens),
        and whether they are every gate closed now (the others known before are gone)."""
        news, every = self._news, self._every
        self._news, self._every = {}, False
        return news, every
