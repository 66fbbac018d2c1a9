"""The redirect of a revisited request, carried under the original's lease, in memory.

A revisited URL that redirects is fetched at each of its visits with its target
(:meth:`~scrapy_ha.scheduler.revisits.Revisits.redirected`). The target is no request of its
own in Redis: it waits here, goes to the engine before anything else
(:meth:`Carried.take`), and the original's visit ends only once its target is finished, by
the target's outcome (:func:`outcome_of`): the target's retry is the original's retry, the
target's failure a failed visit of the original (dead-lettered only after
``HA_REVISIT_MAX_FAILURES`` of them in a row). A worker killed meanwhile loses nothing: the
original's lease expires and the original is visited again, redirect and all. Before, the
target was stored as a child at each visit, and a removed page that redirects to a 404 page
made one dead letter per visit, for ever.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy_ha import metakeys

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request

__all__ = ["Carried", "outcome_of"]

#: What a finished target hands to its original: its verdict and the attempts behind it
#: (a retry of the original counts them, a dead letter shows them); the checkpoint its
#: callback saves as the page ends, and what its content was (changed or not: the
#: original's visit ends by it, its signature kept for the next).
_ALWAYS = (metakeys.CHECKPOINT_SAVE, metakeys.REVISIT_SEEN)
_HANDED_OVER = (metakeys.OUTCOME, metakeys.RETRIES, metakeys.HISTORY, *_ALWAYS)


class Carried:
    """The carried targets of this worker's requests in flight, by the original's entry id."""

    def __init__(self) -> None:
        #: entry id -> its target (the last of a chain of redirects)
        self.targets: dict[str, Request] = {}
        #: the targets not handed to the engine yet, in the order they came
        self.waiting: dict[str, Request] = {}

    def __len__(self) -> int:
        """Targets waiting for the engine (counted as pending: the spider stays open)."""
        return len(self.waiting)

    def target_of(self, entry_id: str) -> Request | None:
        return self.targets.get(entry_id)

    def carry(self, entry_id: str, target: Request) -> None:
        """*target* goes to the engine under *entry_id*'s lease (a redirect of the target
        handed out before takes its place)."""
        self.targets[entry_id] = target
        self.waiting[entry_id] = target

    def take(self) -> Request:
        """The first target waiting (the caller saw one), now handed to the engine."""
        return self.waiting.pop(next(iter(self.waiting)))

    def finished(self, entry_id: str, busy: Callable[[Request], bool]) -> bool:
        """Whether *entry_id*'s target (if any) was handed out and the engine is done with it."""
        target = self.targets.get(entry_id)
        return target is None or (entry_id not in self.waiting and not busy(target))

    def pop(self, entry_id: str) -> Request | None:
        """Forget *entry_id*'s target: its original ends (a target still waiting is dropped:
        the original's lease is released or expires, and it is visited again)."""
        self.waiting.pop(entry_id, None)
        return self.targets.pop(entry_id, None)

    def clear(self) -> None:
        self.targets.clear()
        self.waiting.clear()


def outcome_of(original: Request, target: Request) -> None:
    """Hand the finished *target*'s verdict (with its attempts) and its checkpoint to
    *original*, whose lease ends by them: its payload stays the original's URL."""
    # without a verdict, the target's attempts are the original's own, copied: left as they are
    keys = _HANDED_OVER if metakeys.OUTCOME in target.meta else _ALWAYS
    for key in keys:
        if key in target.meta:
            original.meta[key] = target.meta.pop(key)
