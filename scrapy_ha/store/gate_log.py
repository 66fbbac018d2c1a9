"""The crawl's gates as one worker learns them: a 429 with Retry-After closes its domain for
every worker (``gate.lua``), and each sync returns only the gates changed since the number
of the last change the worker saw (``sync.lua``, KEYS[27]). Before, every call read and
returned every closed gate: at 1,000 gates, 5.8 times a round's Redis instructions."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy_ha.store.wire import SyncResult


class GateLog:
    """One shard's gate number and the changes its replies brought that the worker has not
    taken yet: every sync of the shard feeds it (an ack-only call too), the worker's round
    takes them (:meth:`take`)."""

    def __init__(self) -> None:
        #: the number of the last gate change seen (0: none): sent with every sync
        self.number = 0
        self._news: dict[str, int] = {}
        self._every = False

    def note(self, since: int, result: SyncResult) -> None:
        """Keep the gates of the reply of a call that sent *since*."""
        if result.gate_number < since:
            # the log is behind the number sent: lost with its Redis (a restart without
            # persistence, a flush), so the reply holds every gate closed now
            self._news, self._every = dict(result.gates), True
            self.number = result.gate_number
            return
        news = self._news
        for domain, until in result.gates.items():
            if until > news.get(domain, 0):
                news[domain] = until
        self.number = max(self.number, result.gate_number)

    def take(self) -> tuple[dict[str, int], bool]:
        """The gates learnt since the last take (domain -> server ms it opens), and whether
        they are every gate closed now (the others known before are gone)."""
        news, every = self._news, self._every
        self._news, self._every = {}, False
        return news, every
