"""Every ``Request.meta`` key scrapy-ha reads or writes, in one place.

Three kinds, and the name says which:

- **Public** keys (``ha_*``) are the ones a spider sets or reads: they are documented in
  docs/reference.md and keep their names across releases.
- **Carried** keys (``ha_*``, set by scrapy-ha) travel with the request through Redis because the
  next attempt or the next page needs them (retry counts, history, a task's progress). A spider
  may read them; it should not write them.
- **Internal** keys (``_ha_*`` and ``ha_lease``/``ha_outcome``) belong to one attempt; the codec
  strips them before a request is stored, so they never reach Redis.
"""

from __future__ import annotations

__all__ = [
    "CHECKPOINT",
    "COOKIES_VERSION",
    "GATE_WAITED",
    "HISTORY",
    "LEASE",
    "LOGGING_IN",
    "LOGINS_MET",
    "LOGIN_EPOCH",
    "NOT_BEFORE",
    "PACED",
    "NEXT_PAGE",
    "OUTCOME",
    "PARENT",
    "PROXY",
    "PROXY_SESSION",
    "RETRY_BASE_PRIORITY",
    "RERUN",
    "RECRAWL_AFTER",
    "RETRIES",
    "RETRY_TIMES",
    "ROTATE_HEADER",
    "REVISIT",
    "REVISIT_SEEN",
    "REVISIT_STATE",
    "REVISIT_TARGET",
    "STRIPPED",
    "SUSPECT",
    "TASK",
    "TASK_STATE",
    "USER_AGENT",
    "CHECKPOINT_SAVE",
    "HANDED",
    "OWN_HEADERS",
]

# -- public: a spider sets or reads these -------------------------------------------------
#: The task a request belongs to: a name on a root request (``False`` opts it out).
TASK = "ha_task"
#: The spider's own checkpoint fields: read from ``response.meta``, written back by the spider.
CHECKPOINT = "ha_checkpoint"
#: ``True`` marks a request as its task's next page (when its callback differs from its parent's).
NEXT_PAGE = "ha_next_page"
#: ``True`` on a start request runs a finished task again.
RERUN = "ha_rerun"
#: A per-request retry budget, for every failure class (overrides ``HA_RETRY_POLICIES``).
RETRY_TIMES = "ha_retry_times"
#: Seconds after which a request seen before is new again (at most ``HA_DUPEFILTER_TTL``).
RECRAWL_AFTER = "ha_recrawl_after"
#: Seconds between two visits of a request (0, False, None: not revisited; see HA_REVISIT).
REVISIT = "ha_revisit"

# -- carried: set by scrapy-ha, stored with the request ---------------------------------
#: The task's progress (pages done, items seen), carried along its chain of pages.
TASK_STATE = "ha_cp"
#: In :data:`TASK_STATE`: the task is one done in an earlier run of the crawl, run again
#: (``HA_CHECKPOINT_RERUN``): its chain's pages after its root are filtered within this run
#: alone, not by the runs before (its root as any request; a task done in this run, met
#: again, is not marked: a review found it crawled twice in one run).
TASK_RERUN = "rerun"
#: :data:`TASK_RERUN`'s value for a task resumed from a checkpoint of a version that
#: recorded no run (it may be a rerun that version left mid-way), or from a rerun's saved in
#: a run before (its chain may have branched, the rerun done): a rerun until its chain
#: branches (a branch's pages are filtered as any: a branched task's checkpoint, never done,
#: stays before the branch, and each later run crawled every branch again; a review).
RERUN_GUESSED = "guessed"
#: Attempts so far per failure class: ``{"server": 2, ...}``.
RETRIES = "ha_retries"
#: The request's priority before its first retry lowered it (``RETRY_PRIORITY_ADJUST``): a
#: revisit's next visit starts from it again, with its attempts.
RETRY_BASE_PRIORITY = "ha_retry_base_priority"
#: The attempt history: ``[{"t", "outcome", "worker", "proxy"}, ...]``.
HISTORY = "ha_history"
#: The id (``host:port``) of the proxy an attempt went through; never a password.
PROXY = "ha_proxy"
#: The tunnel session an attempt used.
PROXY_SESSION = "ha_proxy_session"
#: The version of the shared cookie jar the request needs.
COOKIES_VERSION = "ha_cookies_v"
#: ``[URL, n]``: ``scrapy_ha.cookies.login_once`` sent the page of URL again n times after a
#: login; at ``MAX_LOGINS_MET`` it raises ``LoginFailed`` instead (a login that opens no
#: session). Another URL's count (meta copied into a child) does not count.
LOGINS_MET = "ha_logins_met"
#: The User-Agent the pool (HA_USER_AGENTS) put on the request's last attempt: the next
#: attempt picks again (a header of the spider's own differs, and is kept).
USER_AGENT = "ha_user_agent"
#: True once a 429 to this request, handed out before its domain's gate closed, waited for
#: the gate without an attempt: its next 429 is an attempt (cleared by any attempt judged).
GATE_WAITED = "ha_gate_waited"
#: What is kept of a revisited URL between visits (``scrapy_ha.config.continuous.RevisitState``).
REVISIT_STATE = "ha_revisit_state"

# -- internal: one attempt only, stripped before storing --------------------------------
#: The lease ``(entry id, token)`` of a request handed out by the scheduler; a new one per lease.
LEASE = "ha_lease"
#: The verdict of the retry middleware on this attempt (retry or dead-letter, class, reason, delay).
OUTCOME = "ha_outcome"
#: On each request a callback yields: the lease of the page that yielded it. A child is stored
#: only while its parent's lease is held.
PARENT = "_ha_parent"
#: A checkpoint to save when this page's lease is acked.
CHECKPOINT_SAVE = "_ha_cp_save"
#: How many leases of this request expired before (its worker died or stalled).
SUSPECT = "_ha_suspect"
#: What the revisit middleware found of this visit: ``(outcome, RevisitState of the answer)``.
REVISIT_SEEN = "_ha_revisit_seen"
#: On the redirect of a revisited request, carried under its lease: the state of the page
#: (without its validators) that the target's content is told against, as a revisit's is.
REVISIT_TARGET = "_ha_revisit_target"
#: On a start request resumed from its task's checkpoint: ``(fingerprint, URL)`` of the
#: task's root request (the URL None for a ``dont_filter`` root), which the scheduler
#: deduplicates it by (a run seeds the task once, from whichever worker, resumed or not:
#: see scheduler/admission.py).
START_OF = "_ha_start_of"
#: The time (``time.monotonic()``) before which a leased request may not start: its
#: domain's crawl-wide rate limit (``HA_DOMAIN_RATE``).
NOT_BEFORE = "_ha_not_before"
#: ``(entry id, domain, 1/rate)`` of a leased request of a domain with a rate: a late start
#: of its domain holds the domain's next one (scheduler/domains.StartTimes).
PACED = "_ha_paced"

#: When (``time.monotonic()``) the scheduler handed this attempt to its engine: a 429 to a
#: request handed out before its domain's gate closed waits for the gate, no attempt spent.
HANDED = "_ha_handed"
#: The names of the headers this attempt had when handed to the engine (the request's own):
#: the others, a downloader middleware's, are not stored with a retry or a revisit.
OWN_HEADERS = "_ha_own_headers"

#: The login epoch of the shared session this attempt was sent with (kept along a chain of
#: redirects: the page that was sent to the login form is the one that met the expiry).
LOGIN_EPOCH = "_ha_login_epoch"
#: True on the request of a ``login_once`` login: it carries the epoch of the login it is.
LOGGING_IN = "_ha_logging_in"

#: True while this attempt carries the proxy's rotation header (HA_PROXY_ROTATE_HEADER): the
#: proxy middleware takes the header off again when the attempt ends.
ROTATE_HEADER = "_ha_rotate_header"

#: Keys the codec drops before storing: they describe one attempt and would be stale, or
#: secret, on the next (the next attempt sets them again). Scrapy's own per-attempt keys are
#: listed beside them.
STRIPPED = frozenset(
    (
        LEASE,
        PARENT,
        OUTCOME,
        CHECKPOINT_SAVE,
        SUSPECT,
        NOT_BEFORE,
        PACED,
        START_OF,
        REVISIT_SEEN,
        REVISIT_TARGET,
        HANDED,
        OWN_HEADERS,
        ROTATE_HEADER,
        LOGIN_EPOCH,
        LOGGING_IN,
        "_auth_proxy",  # HttpProxyMiddleware: the proxy whose credentials are in the headers
        "download_latency",  # the download handler: how long this attempt took
        "cached_response",  # HttpCacheMiddleware: a Response object of this attempt
        "playwright_page",  # scrapy-playwright (playwright_include_page): this attempt's page
    )
)
