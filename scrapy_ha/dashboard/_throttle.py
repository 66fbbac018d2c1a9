"""How many wrong tokens the login form takes: a few per address and minute.

A dashboard with a token answers everyone who reaches it, so its login form is where a
token would be guessed. After :data:`MAX_FAILURES` wrong tokens from one address within
:data:`WINDOW_S` seconds, that address is refused (429, ``Retry-After``) until the oldest
of them is that old, without its token even being compared: a guess costs a minute per
five. A right token clears the address's count. Behind a reverse proxy every browser has
the proxy's address: they share the allowance (the dashboard does not trust
``X-Forwarded-For``, which anyone can send).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["LoginThrottle"]

#: Wrong tokens an address may send within WINDOW_S: room for typos, none for guessing.
MAX_FAILURES = 5
#: The window, in seconds.
WINDOW_S = 60.0
#: Addresses remembered at most (the least recent are forgotten first): a flood of
#: addresses costs a bounded amount of memory.
MAX_ADDRESSES = 10_000


class LoginThrottle:
    """Wrong tokens per client address over the last :data:`WINDOW_S` seconds."""

    def __init__(
        self,
        max_failures: int = MAX_FAILURES,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self._clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, address: str) -> deque[float]:
        found = self._failures.get(address)
        if found is None:
            return deque()
        horizon = self._clock() - self.window_s
        while found and found[0] <= horizon:
            found.popleft()
        if not found:
            del self._failures[address]
        return found

    def wait(self, address: str) -> float:
        """Seconds until *address* may try a token again (0: now)."""
        recent = self._recent(address)
        if len(recent) < self.max_failures:
            return 0.0
        return max(0.0, recent[0] + self.window_s - self._clock())

    def failed(self, address: str) -> None:
        """*address* sent a wrong token."""
        recent = self._recent(address)
        recent.append(self._clock())
        self._failures[address] = recent
        self._failures.move_to_end(address)
        while len(self._failures) > MAX_ADDRESSES:
            self._failures.popitem(last=False)

    def passed(self, address: str) -> None:
        """*address* sent the right token: its count starts again."""
        self._failures.pop(address, None)
