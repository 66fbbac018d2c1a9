"""How a new request enters the queue: the one decision on it (:meth:`Admission.admit`).

Already seen here? Storable? Whose child, fenced by which lease? Its dupefilter
fingerprint, its stored form, its priority and its place (the start queue, a checkpointed
task's shard). Redis's dupefilter is the crawl's; this worker also remembers the
fingerprints it sent, so that obvious duplicates are dropped without a round trip.
``scrapy-ha push`` admits requests with the same :class:`Admission`, built from the
project's settings (:mod:`scrapy_ha.cli.project`), so that a pushed request has the
fingerprint, the payload and the shard a worker gives it.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import replace
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from scrapy import signals
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.request import referer_str
from twisted.python.failure import Failure

from scrapy_ha import metakeys
from scrapy_ha.codec import DEFAULT_ALLOWED_SCHEMES, CodecError, encode_request, refused_scheme
from scrapy_ha.keys import FINGERPRINT_BYTES
from scrapy_ha.scheduler import engine
from scrapy_ha.scheduler.seen import LocalSeen
from scrapy_ha.store.bloom import BLOOM_FINGERPRINT_BYTES
from scrapy_ha.store.buckets import sized
from scrapy_ha.store.dictionary import Compactor
from scrapy_ha.store.forget import ForgetRules
from scrapy_ha.store.hosts import url_host
from scrapy_ha.store.scripts import MAX_PRIORITY
from scrapy_ha.store.wire import Fresh, NewEntry, clamp_priority
from scrapy_ha.verdict import FailureClass, Verdict

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

    from scrapy_ha.config.scheduler import SchedulerConfig
    from scrapy_ha.scheduler.inflight import Kin
    from scrapy_ha.store.wire import SyncResult

logger = logging.getLogger(__name__)

#: The characters of an unstorable page's reason past which no more of its children are
#: named there (the first always is), only said to be more: each went whole into the
#: reason, and a page of 16,000 gave a dead letter of 8 MB (the loop held 57 s copying it).
UNSTORABLE_REASON_CHARS = 2000
_MORE = "; and more (ha/unstorable counts them, each in an ERROR line)"


class Admission:
    """Fingerprints (``SCHEDULER_DUPEFILTER`` semantics), local duplicates, priority clamp,
    and requests that cannot be stored."""

    def __init__(
        self,
        crawler: Crawler,
        *,
        dedupe: bool,
        dedupe_start: bool,
        debug: bool,
        unstorable: str,
        start_queue: bool = False,
        schemes: frozenset[str] = DEFAULT_ALLOWED_SCHEMES,
        fingerprint_bytes: int = FINGERPRINT_BYTES,
        ttl: float = 0.0,
    ) -> None:
        self.crawler = crawler
        #: bytes of each fingerprint sent: more for a Bloom filter (see store/bloom.py)
        self.fingerprint_bytes = fingerprint_bytes
        self.unstorable = unstorable  # HA_UNSTORABLE
        self.start_queue = start_queue  # start requests kept in their own queue
        self.schemes = schemes  # HA_ALLOWED_SCHEMES
        #: "<scheme>:" of each allowed scheme urlsplit reads as written: a URL that starts
        #: with one is allowed (refused_scheme's first test, in one call: per request)
        self._allowed_heads = tuple(
            f"{s}:" for s in sorted(schemes) if s.isalnum() and s.islower() and s[0].isalpha()
        )
        self._schemes_warned: set[str] = set()
        self.dedupe = dedupe
        self.dedupe_start = dedupe_start
        self.debug = debug
        #: the fingerprints this worker sent, and when (HA_DUPEFILTER_TTL is ``ttl``)
        self.seen = LocalSeen(ttl)
        #: ``scrapy-ha seen forget`` rules (store/forget.py), as read at the last renewal
        self.rules = ForgetRules()
        self._rules_read = False  # (the first read's rules are no news: see set_rules)
        #: the crawl's run this worker joined (store/runs.py): start requests are seeded
        #: once per run
        self.run = 1
        #: times each ``dont_filter`` start request was seen, until ``start()`` is read to
        #: its end (about 90 bytes a start request: 87 MB for a million, measured)
        self._starts: dict[bytes, int] = {}
        self._dupes_logged = False
        self._clamp_warned = False
        #: compacts new requests once the crawl has a dictionary (see :meth:`from_config`)
        self.compactor = Compactor(enabled=False)

    @classmethod
    def from_config(cls, crawler: Crawler, config: SchedulerConfig) -> Self:
        admission = cls(
            crawler,
            dedupe=config.dedupe,
            dedupe_start=config.dedupe_start_requests,
            debug=config.dupefilter_debug,
            unstorable=config.unstorable,
            start_queue=bool(config.start_order),
            schemes=config.allowed_schemes,
            fingerprint_bytes=BLOOM_FINGERPRINT_BYTES
            if config.memory.dupefilter == "bloom"
            else FINGERPRINT_BYTES,
            ttl=config.dupefilter_ttl,
        )
        admission.compactor = Compactor(enabled=config.memory.compact_payloads)
        return admission

    def admit(self, request: Request, kin: Kin, spider: Spider | None) -> NewEntry | None:
        """The entry to queue for *request*, or None if it is refused: a duplicate this
        worker already sent (``dupefilter/filtered``), or a request that cannot be stored
        (its page, *kin*'s parent, is dead-lettered when it finishes), or one of a scheme
        outside ``HA_ALLOWED_SCHEMES``."""
        if self.refuses_scheme(request):
            return None
        fingerprint, seen = self.fingerprint(request), self.seen
        age = seen.age(request) if fingerprint and metakeys.RECRAWL_AFTER in request.meta else None
        if fingerprint and seen.seen(fingerprint, age):
            self.log_duplicate(request)
            return None
        try:
            payload = self.payload(request, spider)
        except CodecError as exc:
            self.refuse_unstorable(request, exc, kin.parent, spider)
            return None
        compactor = self.compactor  # (compacted when a round sends it pending: Handout.seal)
        if compactor.enabled and compactor.dictionary is None:
            compactor.sample(payload)
        seen.remember(fingerprint)
        if not -MAX_PRIORITY <= request.priority <= MAX_PRIORITY:
            self.note_priority(request)
        if kin.late:
            self._log_late(request)
        entry = self.entry(request, fingerprint, payload, parent=kin.fence, fresh=Fresh(request))
        # (an age under 1 ms, 0 included, is sent as 1 ms: 0 on the wire means the TTL)
        return entry if age is None else replace(entry, age_ms=max(1, int(age * 1000)))

    def payload(self, request: Request, spider: Spider | None) -> bytes:
        """*request* as stored (:func:`~scrapy_ha.codec.encode_request` under
        ``HA_UNSTORABLE``; the codec reads the spider's settings through its crawler)."""
        return encode_request(request, spider, unstorable=self.unstorable)

    def entry(
        self,
        request: Request,
        fingerprint: bytes,
        payload: bytes,
        *,
        parent: tuple[str, str] | None = None,
        fresh: Fresh | None = None,
    ) -> NewEntry:
        """*request* as it is enqueued: a start request in the start queue when start
        requests have their own (``SCHEDULER_START_MEMORY_QUEUE``); a request of a
        checkpointed task (``ha_task``) placed by its task in a sharded crawl, any other by
        its *fingerprint* (see ``ShardedQueue.place``)."""
        meta = request.meta
        start = self.start_queue and bool(meta.get("is_start_request"))
        task = meta.get(metakeys.TASK)
        task = task if isinstance(task, str) else ""
        host = url_host(request.url)
        # every field by position (age_ms 0: the crawl's; see admit): a keyword argument
        # costs a call per request a third more (docs/benchmarks.md)
        return NewEntry(fingerprint, request.priority, payload, parent, fresh, start, task, 0, host)

    def _log_late(self, request: Request) -> None:
        """A request that names a page this worker finished was scheduled later with that
        page's meta copied (``meta=response.meta``, from a ``spider_idle`` handler): the
        page is acked, nobody redoes it, so fencing it by that lease would lose it."""
        assert self.crawler.stats is not None
        self.crawler.stats.inc_value("ha/late_requests")
        logger.info(
            "%s names a page this worker already finished (its meta was copied from that "
            "page after it ended): it is queued as a new request, not as that page's child",
            request,
        )

    def refuses_scheme(self, request: Request) -> bool:
        """Is *request* of a scheme outside ``HA_ALLOWED_SCHEMES``? Then it is not queued
        (a WARNING once per scheme, ``ha/scheme_refused``): any worker may lease a queued
        request back, and none fetches another scheme from Redis, so the setting holds for
        what the spider yields too, whichever worker would download it."""
        if request.url.startswith(self._allowed_heads):
            return False
        refusal = refused_scheme(request, self.schemes)
        if refusal is None:
            return False
        assert self.crawler.stats is not None
        self.crawler.stats.inc_value("ha/scheme_refused")
        scheme = urlparse_cached(request).scheme
        if scheme not in self._schemes_warned:
            self._schemes_warned.add(scheme)
            logger.warning(
                "Not queued: %s; whoever can write to the crawl's Redis could then make "
                "workers fetch such URLs too (further refusals are counted in "
                "ha/scheme_refused)",
                refusal,
            )
        return True

    def fingerprint(self, request: Request) -> bytes:
        """The dupefilter fingerprint, or b"" for a request that is never filtered.

        A ``dont_filter`` start request is filtered only against the same request yielded
        as often by another worker's ``start()`` in the same run of the crawl (see
        :meth:`_start_fingerprint`): N workers seed a run once, whatever order each
        ``start()`` yields in, a start request repeated on purpose is crawled as often as
        it is repeated, and the next run of a persisted crawl seeds it again.
        """
        meta = request.meta
        root = meta.get(metakeys.START_OF)
        if root is not None and root[1] is not None and metakeys.LEASE not in meta:
            # resumed from its task's checkpoint, the task's root filtered as any request:
            # the resumed request is filtered as that root is (a start request, or a root a
            # page yielded again when redone: its task was seeded once, its chain queued)
            return self._filtered(root[0], root[1], None) if self.dedupe else b""
        if self._is_start(request):
            if request.dont_filter:
                return self._start_fingerprint(request)
        elif self._starts and engine.start_exhausted(self.crawler):
            self._starts.clear()  # start() is read to its end: no start request comes now
        if request.dont_filter or not self.dedupe:
            return b""
        fingerprint = self.crawler.request_fingerprinter.fingerprint(request)
        state = meta.get(metakeys.TASK_STATE) or {}
        if state.get(metakeys.TASK_RERUN) and state.get("page", 1) > 1:
            # a page after the root of a task done in a run before, run again: filtered
            # within this run alone; the runs before saw it (a QA run: the rerun crawled
            # the first page only, and each later run one more page of it again)
            return self._within_run(b"rerun %d " % self.run, fingerprint)
        return self._filtered(fingerprint, request.url, request)

    def _filtered(self, fingerprint: bytes, url: str, request: Request | None) -> bytes:
        """The dupefilter fingerprint of the request of *url* (*request*, if at hand) with
        this fingerprint."""
        fingerprint = sized(fingerprint, self.fingerprint_bytes)
        if self.rules:  # forgotten by a rule: known by another fingerprint since
            parsed = urlsplit(url) if request is None else urlparse_cached(request)
            return self.rules.fingerprint(fingerprint, url, parsed.hostname or "")
        return fingerprint

    def set_rules(self, rules: ForgetRules) -> None:
        """The crawl's forget rules changed (``scrapy-ha seen forget``): what this worker
        remembers of the fingerprints it sent may name URLs forgotten since."""
        first, self._rules_read = not self._rules_read, True
        if rules.version != self.rules.version:
            self.rules = rules
            self.seen.clear()
            if first:  # an earlier forget's, read at this worker's start: nothing changed
                return
            logger.info(  # (before: unsaid)
                "`scrapy-ha seen forget` changed what the crawl has seen (forget %d; %d "
                "domain and %d pattern rule(s) in force): a forgotten URL is crawled again "
                "when a page links to it",
                rules.version,
                len(rules.domains),
                len(rules.patterns),
            )

    def _start_fingerprint(self, request: Request) -> bytes:
        """The fingerprint of the n-th ``dont_filter`` start request of this worker that is
        this request (n = 1, 2, ...) in this run of the crawl: the same in every worker of
        the run whose ``start()`` yields the same requests, in whatever order (a set's order
        differs per process), and another in the next run. A request resumed from its
        task's checkpoint counts as its task's root request (``meta["_ha_start_of"]``): a
        worker that joins the run, or restarts into it, resumes a task another worker
        seeded already (its pages in the queue) and is filtered, as its root would be (a
        root filtered as any request: see :meth:`fingerprint`)."""
        root = request.meta.get(metakeys.START_OF)
        fingerprint = root[0] if root else self.crawler.request_fingerprinter.fingerprint(request)
        key = fingerprint[: self.fingerprint_bytes]
        n = self._starts[key] = self._starts.get(key, 0) + 1
        return self._within_run(b"start %d.%d " % (self.run, n), fingerprint)

    def _within_run(self, occurrence: bytes, fingerprint: bytes) -> bytes:
        """A fingerprint of its own for *fingerprint* as *occurrence* names it (in this run
        of the crawl): filtered against the same occurrence alone, not the request's own."""
        return hashlib.sha1(occurrence + fingerprint).digest()[: self.fingerprint_bytes]  # noqa: S324 - not a secret

    def _is_start(self, request: Request) -> bool:
        """A start request seen for the first time (a retry or redirect of one carries the
        lease of its original), when start requests are deduplicated across workers."""
        meta = request.meta
        return bool(
            self.dedupe_start and meta.get("is_start_request") and metakeys.LEASE not in meta
        )

    def remember(self, fingerprint: bytes) -> None:
        self.seen.remember(fingerprint)

    def forget_refused(self, sent: list[NewEntry], result: SyncResult) -> None:
        """Children refused by the parent fence were never stored: forget their
        fingerprints, or this worker would drop them as duplicates when it redoes the page.
        With ``HA_DUPEFILTER_TTL``, requests Redis filtered were seen there at a time this
        worker does not know: remembered as sent now, they were dropped here up to a TTL
        after Redis took them as new again; they are kept a slice of the TTL only
        (:meth:`LocalSeen.doubt`). (Which requests were refused or filtered is not reported:
        forgetting an accepted one only sends a later duplicate to Redis, which drops it.)"""
        if result.refused:
            self.seen.forget([e.fingerprint for e in sent if e.parent])
        if self.seen.ttl and result.added < len(sent):
            self.seen.doubt([e.fingerprint for e in sent])

    def log_duplicate(self, request: Request) -> None:
        """As Scrapy's RFPDupeFilter: the first duplicate, or each with DUPEFILTER_DEBUG."""
        stats = self.crawler.stats
        assert stats is not None
        stats.inc_value("ha/filtered")
        stats.inc_value("dupefilter/filtered")
        if self.debug:
            logger.debug(
                "Filtered duplicate request: %(request)s (referer: %(referer)s)",
                {"request": request, "referer": referer_str(request)},
            )
        elif not self._dupes_logged:
            self._dupes_logged = True
            logger.debug(
                "Filtered duplicate request: %(request)s - no more duplicates will be "
                "shown (see DUPEFILTER_DEBUG to show all duplicates)",
                {"request": request},
            )

    def note_priority(self, request: Request) -> None:
        """Priorities beyond the score's range are clamped: count them, warn once."""
        if -MAX_PRIORITY <= request.priority <= MAX_PRIORITY:
            return
        assert self.crawler.stats is not None
        self.crawler.stats.inc_value("ha/priority_clamped")
        if not self._clamp_warned:
            self._clamp_warned = True
            logger.warning(
                "Priority %d of %s is outside the range scrapy-ha stores (-%d to %d): it is "
                "queued as %d (further ones are counted in ha/priority_clamped)",
                request.priority,
                request,
                MAX_PRIORITY,
                MAX_PRIORITY,
                clamp_priority(request.priority),
            )

    def refuse_unstorable(
        self, request: Request, exc: CodecError, parent: Request | None, spider: Spider | None
    ) -> None:
        """Fail *parent*, the page that yielded *request* (dead-lettered when it finishes)."""
        assert self.crawler.stats is not None
        self.crawler.stats.inc_value("ha/unstorable")
        logger.error(  # *exc* says what to do: HA_UNSTORABLE only where it would store it
            "Cannot store %s in Redis (%s): %s",
            request,
            exc,
            f"the page {parent} that yielded it will be dead-lettered"
            if parent is not None
            else "the request is dropped",
        )
        if parent is not None:  # every child it could not store named (the first first)
            reason = f"child {request.url}: {exc}"
            told = parent.meta.get(metakeys.OUTCOME)
            if isinstance(told, Verdict) and told.failure_class == FailureClass.UNSTORABLE:
                reason = _named(told.reason, reason)
            parent.meta[metakeys.OUTCOME] = Verdict.dead(FailureClass.UNSTORABLE, reason)
        self.crawler.signals.send_catch_log(
            signal=signals.spider_error,
            failure=Failure(exc),  # type: ignore[no-untyped-call]  # Twisted's Failure is untyped
            response=None,
            spider=spider,
        )


def _named(told: str, reason: str) -> str:
    """The page's reason *told* with the next child's *reason* (up to
    ``UNSTORABLE_REASON_CHARS``, then once said to be more)."""
    if told.endswith(_MORE):
        return told
    if len(told) + len(reason) + 2 > UNSTORABLE_REASON_CHARS:
        return told + _MORE
    return f"{told}; {reason}"
