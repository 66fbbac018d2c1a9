"""The crawl's gates as one worker learns them: a 429 with Retry-After closes its domain for
every worker (``gate.lua``), and each sync returns only the gates changed since the number
of the last change the worker saw (``sync.lua``, KEYS[27]). Before, every call read and
returned every closed gate: at 1,000 gates, 5.8 times a round's Redis instructions."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy_ha.store.wire import SyncResult


#: How a gate open now is kept (a ``time.monotonic()`` long past): expired, or opened early
#: by an operator (``scrapy-ha gates open``, ``gate_open.lua``).
OPEN = 0.0


class GateLog:
    """One shard's gate number and the changes its replies brought that the worker has not
    taken yet: every sync of the shard feeds it (an ack-only call too), the worker's round
    takes them (:meth:`take`). A gate is kept as the ``time.monotonic()`` it opens, read by
    the clock of the reply that brought it (a round's own reply may carry no clock: a
    sharded round that called no shard), or :data:`OPEN`."""

    def __init__(self) -> None:
        #: the number of the last gate change seen (0: none): sent with every sync
        self.number = 0
        #: domain -> (the gate number of the reply that said it, when it opens)
        self._news: dict[str, tuple[int, float]] = {}
        #: domain -> the gate number of the word on it the last take took: an older reply
        #: noted after it (calls that overlapped) is passed over
        self._taken: dict[str, int] = {}
        self._every = False

    def note(self, since: int, result: SyncResult) -> None:
        """Keep the gates of the reply of a call that sent *since*."""
        now = time.monotonic()
        number = result.gate_number
        gates = {
            d: (number, now + (until - result.now_ms) / 1000 if until > 0 else OPEN)
            for d, until in result.gates.items()
        }
        if number < since:
            # the log is behind the number sent: lost with its Redis (a restart without
            # persistence, a flush, garbage), so the reply holds every gate closed now
            self._news, self._every = gates, True
            self._taken.clear()
            self.number = number
            return
        news, taken = self._news, self._taken
        for domain, said in gates.items():
            # the word of the later log wins (an operator opens a gate early, a 429 then
            # closes it for less); of the same log, the later opening (replies of calls
            # that overlapped, noted out of order)
            if said > news.get(domain, (taken.get(domain, 0), OPEN)):
                news[domain] = said
        self.number = max(self.number, number)

    def take(self) -> tuple[dict[str, float], bool]:
        """The gates learnt since the last take (domain -> ``time.monotonic()`` it opens,
        :data:`OPEN` for one open now), and whether they are every gate of the log (the
        others known before are gone)."""
        news, every = self._news, self._every
        self._news, self._every = {}, False
        self._taken = {domain: number for domain, (number, _) in news.items()}
        return {domain: opens for domain, (_, opens) in news.items()}, every
