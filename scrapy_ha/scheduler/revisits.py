"""Which finished requests are visited again, and when (``HA_REVISIT``, ``meta["ha_revisit"]``).

A revisited request's lease does not end by an ack: its page done, it goes back to the
delayed set, due again after its interval (:mod:`scrapy_ha.scheduler.session.revisit`), with
its attempts reset (``ha_retries`` and ``ha_history`` dropped) and what is kept of the URL
between visits in its ``meta["ha_revisit_state"]``: the interval, the validators and the
signature of the last full answer (:class:`~scrapy_ha.config.continuous.RevisitState`), which
``scrapy_ha.revisit.RevisitMiddleware`` reads to send conditional requests and to tell a
changed page from an unchanged one. Fixed revisits keep their interval; adaptive ones
(``HA_REVISIT_ADAPTIVE``) get the freshness-optimal interval of the change rate their
visits show, at the crawl's multiplier (:mod:`scrapy_ha.config.freshness`), which Redis
nudges so that the intervals spend ``HA_REVISIT_BUDGET``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from scrapy_ha import metakeys
from scrapy_ha.config.continuous import CONDITIONAL_HEADERS, FIRST_MULTIPLIER, RevisitState
from scrapy_ha.config.freshness import multiplier_range
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.keys import FINGERPRINT_BYTES
from scrapy_ha.scheduler.outbox import Allocation, Load, VisitEnd
from scrapy_ha.store.bloom import BLOOM_FINGERPRINT_BYTES
from scrapy_ha.store.buckets import sized
from scrapy_ha.verdict import Verdict

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Self

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from scrapy_ha.config.continuous import RevisitConfig
    from scrapy_ha.config.scheduler import SchedulerConfig

__all__ = ["Revisits"]

logger = logging.getLogger(__name__)


class Revisits:
    """Decides, when a request is finished, whether and when it is visited again."""

    def __init__(
        self,
        config: RevisitConfig,
        fingerprint: Callable[[Request], bytes],
        clock: Callable[[], float] = time.time,
        stats: StatsCollector | None = None,
        *,
        seen: bool = True,
    ) -> None:
        self.config = config
        self.fingerprint = fingerprint
        #: the crawl deduplicates: a revisited URL is seen again at each visit (without,
        #: its fingerprint still keeps one revisit entry per URL, and nothing is kept seen)
        self.seen = seen
        self.clock = clock
        self.stats = stats
        #: a permanent redirect of a revisited URL was said (a WARNING once per worker)
        self._moved_said = False
        self.allocation = None
        if config.adaptive:
            lowest, highest = multiplier_range(config.minimum, config.maximum)
            self.allocation = Allocation(config.budget, lowest=lowest, highest=highest)

    @classmethod
    def from_config(
        cls, crawler: Crawler, config: SchedulerConfig, clock: Callable[[], float] = time.time
    ) -> Self:
        # as the worker sends it to the dupefilter (Admission): a revisit keeps its URL seen.
        # Computed without a dupefilter too (BaseDupeFilter): one URL, one revisit entry
        # (before, none was sent there, and each copy of a URL linked again was revisited)
        size = BLOOM_FINGERPRINT_BYTES if config.memory.dupefilter == "bloom" else FINGERPRINT_BYTES

        def fingerprint(request: Request) -> bytes:
            return sized(crawler.request_fingerprinter.fingerprint(request), size)

        return cls(config.revisit, fingerprint, clock, crawler.stats, seen=config.dedupe)

    def redirected(self, original: Request, redirect: Request) -> bool:
        """*redirect*, RedirectMiddleware's copy of *original* (its meta and headers
        copied), or of a redirect of it (a chain): the revisits stay with the original, and
        the target is fetched at each of its visits, in full (never filtered as seen,
        without the original's validators), and is not revisited on its own. Its content
        is told against the original's last (``meta[REVISIT_TARGET]``, the original's state
        without its validators): unchanged, it does not reach the callback, as an unchanged
        revisit does not (before, it did at every visit, its items yielded again). A permanent
        redirect (301, 308), the first of its chain, is counted (``ha/revisit/moved``, once
        per visit) and said in a WARNING once per worker process (the others at DEBUG):
        the target revisited instead would cost one request less a visit. Before, the target
        kept the original's ``ha_revisit`` and got a revisit entry of its own: fetched twice
        a period, or filtered as seen at the original's next visits.

        Returns True when *original* is revisited: its visit ends by the target's outcome,
        the target carried under its lease (:mod:`scrapy_ha.scheduler.carry`)."""
        try:
            base = self.config.interval_for(original.url, original.meta)
        except ConfigError:
            return False  # (said when the original ends)
        if base is None:
            return False
        meta = redirect.meta
        state = meta.pop(metakeys.REVISIT_STATE, None)  # the original's validators and evidence
        if metakeys.REVISIT_TARGET not in meta:  # (a chain's later hop: the first hop's copied)
            # validators are the URL's own: another URL's ETag or date sent to the original
            # (once it answers itself again) could get a 304 for a page never seen
            told = replace(RevisitState.from_meta(state), etag="", modified="")
            meta[metakeys.REVISIT_TARGET] = told.as_meta()
        meta[metakeys.REVISIT] = False
        redirect.dont_filter = True
        for header in CONDITIONAL_HEADERS:  # the original's: a 304 would drop the page
            redirect.headers.pop(header, None)
        reasons = meta.get("redirect_reasons") or [None]
        # this visit's earlier hops: not those the original carried in (its own meta's)
        earlier = reasons[len(original.meta.get("redirect_reasons") or ()) : -1]
        if reasons[-1] in PERMANENT_REDIRECTS and not any(
            reason in PERMANENT_REDIRECTS for reason in earlier
        ):
            self._moved(original, redirect)  # the chain's first redirect for good
        return True

    def _moved(self, original: Request, redirect: Request) -> None:
        """Count a visit of a revisited URL redirected for good; say the first in a WARNING
        (once per worker process; one a
        URL, kept for ever, was a line and a key per URL for the life of the process)."""
        if self.stats is not None:
            self.stats.inc_value("ha/revisit/moved")
        level = logging.DEBUG if self._moved_said else logging.WARNING
        self._moved_said = True
        moved = (redirect.meta.get("redirect_urls") or [original.url])[-1]  # the 301's URL
        logger.log(
            level,
            "%s is revisited, and %s redirects for good to %s: each visit fetches them all; "
            "revisit the target instead (said once per worker at WARNING; ha/revisit/moved "
            "counts such redirects, per visit)",
            original.url,
            "it" if moved == original.url else moved,
            redirect.url,
        )

    def visit_end(self, request: Request) -> VisitEnd | None:
        """The end of *request*'s visit as a revisit (its meta updated for the next), or
        None: it is acked (not revisited)."""
        try:
            base = self.config.interval_for(request.url, request.meta)
        except ConfigError as exc:  # revisited before (an earlier version took it): it leaves
            _warn_once(str(exc), f"{exc} ({request}): it is not revisited")
            base = None
        meta = request.meta
        state = RevisitState.from_meta(meta.get(metakeys.REVISIT_STATE))
        if base is None:
            return self._leaving(request, state)
        found, answer = meta.pop(metakeys.REVISIT_SEEN, None) or (
            "unknown" if state.visits else "new",
            state,
        )
        evidence = self._evidence(state, found, answer.age)
        interval = self.config.next_interval(base, evidence, self._multiplier(base))
        meta[metakeys.REVISIT_STATE] = replace(
            answer,
            interval=interval,
            visits=state.visits + 1,
            changes=state.changes + (found == "changed"),
            changed=evidence.changed,
            changed_for=evidence.changed_for,
            unchanged_for=evidence.unchanged_for,
            last=evidence.last,
            dated=evidence.dated,
            failures=0,  # a visit that did not fail starts the count again
        ).as_meta()
        load = None
        if self.allocation is not None:
            first = not state.interval
            held = 0.0 if first else 1 / state.interval
            load = Load(
                1 / interval - held,
                1 / base if first else 0.0,
                FIRST_MULTIPLIER * base,
                held,
                0.0 if first else 1 / base,
            )
        for key in (metakeys.RETRIES, metakeys.HISTORY, metakeys.GATE_WAITED):  # afresh
            meta.pop(key, None)
        _restore_priority(request)
        saved = state.size if found == "not_modified" else 0
        fp = self.fingerprint(request)
        return VisitEnd(interval, fp, found, saved, self.allocation, load, seen=self.seen)

    def failed_visit(self, request: Request) -> VisitEnd | None:
        """The end of a revisited request whose visit failed (its verdict: dead-letter it,
        its retries spent or its failure permanent) as a revisit at its interval, counted
        in its state's ``failures`` (its meta updated for the next visit); None: it is
        dead-lettered, as a URL whose first visit failed (never found: a broken link is
        said at once) or whose ``HA_REVISIT_MAX_FAILURES``-th visit in a row did (its
        verdict's reason says so, and its count starts again for a requeue). Before, one
        failed visit dead-lettered the URL's revisits for good."""
        try:
            base = self.config.interval_for(request.url, request.meta)
        except ConfigError:
            return None
        meta = request.meta
        state = RevisitState.from_meta(meta.get(metakeys.REVISIT_STATE))
        if base is None or not state.visits:
            return None
        failures = state.failures + 1
        if failures >= self.config.max_failures:
            verdict = Verdict.from_meta(meta)
            if verdict is not None:
                reason = f"{verdict.reason} ({failures} failed visits in a row)"
                meta[metakeys.OUTCOME] = replace(verdict, reason=reason)
            meta[metakeys.REVISIT_STATE] = replace(state, failures=0).as_meta()
            return None
        meta[metakeys.REVISIT_STATE] = replace(state, failures=failures).as_meta()
        for key in (metakeys.OUTCOME, metakeys.RETRIES, metakeys.HISTORY, metakeys.REVISIT_SEEN):
            meta.pop(key, None)  # the next visit starts afresh
        _restore_priority(request)
        interval = state.interval if self.config.adaptive and state.interval else base
        load = None
        if self.allocation is not None:  # its interval is kept: the sums do not move
            held = 1 / interval
            load = Load(0.0, 0.0, FIRST_MULTIPLIER * base, held, 1 / base)
        fp = self.fingerprint(request)
        return VisitEnd(interval, fp, "failed", 0, self.allocation, load, seen=self.seen)

    def _leaving(self, request: Request, state: RevisitState) -> VisitEnd | None:
        """The end of a request revisited before and no longer now (no rule of
        ``HA_REVISIT`` matches it): an interval of -1, so that its entry leaves the revisits
        (and, adaptive, the budget's sums) with its lease
        (:data:`scrapy_ha.store.revisits.LEFT`); None (a plain ack) when it was never
        revisited. Fixed revisits too: a plain ack left the entry in ``revisits``, counted
        by ``status`` as a revisited URL due within the hour for a day (QA)."""
        fp = self.fingerprint(request)
        if self.allocation is None:
            return VisitEnd(-1.0, fp, "left", 0, seen=self.seen) if state.visits else None
        if not state.interval:
            return None
        load = Load(0.0, 0.0, FIRST_MULTIPLIER * state.interval, 0.0, 0.0)
        return VisitEnd(-1.0, fp, "left", 0, self.allocation, load, seen=self.seen)

    def _multiplier(self, base: float) -> float:
        if self.allocation is None:
            return 0.0
        return self.allocation.multiplier or FIRST_MULTIPLIER * base

    def _evidence(self, state: RevisitState, found: str, age: float) -> RevisitState:
        """The state with this visit counted in the change rate's evidence: one more
        interval observed, of the seconds since the last visit, changed or not. A changed
        page whose age (``Date`` less ``Last-Modified``) falls within that interval changed
        then and not since: a dated change and its age unchanged, which say more than the
        interval (Cho and Garcia-Molina's last-modified estimator). A first visit counts
        its age as unchanged (what came before it is not known), up to ``HA_REVISIT_MAX``:
        one look does not outweigh the visits after it (a page unchanged for years, then
        changed at each visit, kept the longest interval for visits on end); one whose
        verdict is unknown only starts the clock."""
        now = self.clock()
        if found == "new" and not state.last and age >= 0:
            age = min(age, self.config.maximum)
            return replace(state, unchanged_for=state.unchanged_for + age, last=now)
        if found not in ("changed", "unchanged", "not_modified") or not state.last:
            return replace(state, last=now)
        spanned = max(0.0, now - state.last)
        if found == "changed" and 0 <= age <= spanned + AGE_SLACK:
            unchanged = state.unchanged_for + min(age, spanned)
            return replace(state, dated=state.dated + 1, unchanged_for=unchanged, last=now)
        if found == "changed":
            return replace(
                state,
                changed=state.changed + 1,
                changed_for=state.changed_for + spanned,
                last=now,
            )
        return replace(state, unchanged_for=state.unchanged_for + spanned, last=now)


#: Redirects that move a page for good (said once: its target is worth revisiting instead).
PERMANENT_REDIRECTS = (301, 308)


#: Seconds an age may exceed the interval it is read in and still date the change within
#: it: ``Date`` and ``Last-Modified`` are whole seconds, the interval Redis's clock
#: (as the worker estimates it from its last round trip).
AGE_SLACK = 1.0

#: The warnings said once per process, by reason.
_WARNED: set[str] = set()


def _restore_priority(request: Request) -> None:
    """The next visit starts from the request's own priority: before, the lowering of a
    visit's retries (``RETRY_PRIORITY_ADJUST``) stayed for every visit after, each failed
    attempt one step more, and such pages went after every other due revisit (in a QA run
    of a crawl at its capacity, 137 s between two visits at 30 s)."""
    request.priority = request.meta.pop(metakeys.RETRY_BASE_PRIORITY, request.priority)


def _warn_once(reason: str, message: str) -> None:
    if reason not in _WARNED:
        _WARNED.add(reason)
        logger.warning("%s (said once)", message)
