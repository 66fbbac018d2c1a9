"""What the operator's tools call each number, and what it means: the dashboard shows the
label and the meaning on hover.

A counter of the crawl's ``stats`` hash (:mod:`scrapy_ha.ops.stats`), a state, a failure
class: each has a short label people say and a sentence that says what it counts.
"""

from __future__ import annotations

__all__ = ["CLASSES", "COUNTERS", "STATES", "Label", "class_label", "counter_label"]

from typing import NamedTuple


class Label(NamedTuple):
    """A name as people say it, and what it means."""

    text: str
    meaning: str


#: The live states of a crawl's requests.
STATES = {
    "pending": Label("Pending", "Waiting in the queue for a worker to lease them."),
    "leased": Label("In progress", "Leased by a worker: downloading, or in its callback."),
    "delayed": Label(
        "Delayed",
        "Waiting for a due time: retries, and requests held back by a closed domain gate "
        "or their domain's crawl-wide limits.",
    ),
    "dead": Label(
        "Dead letters", "In the dead-letter queue now: could not be crawled, with the reason."
    ),
    "workers": Label("Workers", "Workers alive now (their heartbeat has not expired)."),
}

#: The counters of the ``stats`` hash (see docs/reference.md, "Crawl-wide counters").
COUNTERS = {
    "enqueued": Label("Queued", "Requests added to the queue since the crawl began."),
    "filtered": Label(
        "Duplicate links", "Links pages yielded that the crawl had seen already: not queued."
    ),
    "start_duplicates": Label(
        "Start requests seen",
        "Start (or pushed) requests the crawl had queued already, such as a second "
        "worker's start requests: not queued again.",
    ),
    "acked": Label("Done", "Requests processed completely and removed from Redis."),
    "reclaimed": Label(
        "Reclaimed leases",
        "Leases that expired (a worker died or stalled): back in the queue for another.",
    ),
    "poison": Label(
        "Poison",
        "Requests dead-lettered because their lease expired 3 times while they ran: "
        "they kill their worker.",
    ),
    "retried": Label("Retries", "Failed attempts put back to be tried again later."),
    "dead": Label(
        "Dead-lettered",
        "Requests moved to the dead-letter queue since the crawl began (requeued and "
        "purged ones included).",
    ),
    "retry_ok": Label("Retries that succeeded", "Requests done after at least one retry."),
    "retry_dead": Label(
        "Retries that failed",
        "Requests dead-lettered after at least one retry, and revisits whose "
        "visit failed after one.",
    ),
    "requeued": Label(
        "Requeued", "Dead letters an operator put back in the queue (attempts reset)."
    ),
    "purged": Label("Purged", "Dead letters an operator deleted for good."),
    "queues_gone": Label(
        "Deleted queues dropped",
        "Entries of the ready set whose back queue had been deleted behind it (by hand, an "
        "eviction, a flush while workers ran): dropped, at most 256 per lease call.",
    ),
    "domain_limited": Label(
        "Held back by domain limits",
        "Times a request waited because its domain was at its crawl-wide limit "
        "(HA_DOMAIN_CONCURRENCY, HA_DOMAIN_RATE).",
    ),
    "revisit": Label(
        "Revisit",
        "A page revisited on a schedule (HA_REVISIT, meta ha_revisit), waiting for its next "
        "visit: a continuous crawl, not a failure.",
    ),
}

#: The failure classes (``scrapy_ha.verdict.FailureClass``) and the scheduler's own.
CLASSES = {
    "network": Label("Network", "Timeouts, DNS errors, refused or reset connections, data loss."),
    "server": Label("Server error", "HTTP 5xx or 408: retried with backoff."),
    "rate_limited": Label(
        "Rate-limited",
        "HTTP 429 (or 503 with Retry-After): the site asked to slow down; its domain is "
        "closed to every worker until then.",
    ),
    "banned": Label("Banned", "HTTP 403 or the spider's ban check: the proxy is rotated."),
    "parse": Label("Parse error", "The callback raised an exception."),
    "pipeline": Label("Pipeline error", "An item pipeline raised an exception."),
    "gone": Label("Gone", "HTTP 404 or 410: the page does not exist; not retried."),
    "client": Label("Client error", "Another HTTP 4xx: not retried."),
    "permanent": Label(
        "Permanent",
        "An error the spider marks as permanent, or a download error no class names: not retried.",
    ),
    "no_proxy": Label("No proxy", "No usable proxy was left: waits for one."),
    "proxy_error": Label("Proxy error", "Choosing a proxy failed."),
    "proxy_auth": Label("Proxy refused", "The proxy refused its credentials."),
    "unstorable": Label("Unstorable", "A request the page yielded could not be stored."),
    "poison": Label("Poison", "Its lease expired 3 times while it ran: it kills its worker."),
    "corrupt": Label("Corrupt", "A queue entry that could not be read back."),
    "refused": Label(
        "Refused", "A URL scheme outside HA_ALLOWED_SCHEMES: never fetched from Redis."
    ),
    "error": Label(
        "Error", "The worker could not judge the failure or carry out the verdict on it."
    ),
    # Delayed without an attempt: why a request waits, not a failure.
    "gate": Label(
        "Waiting for a gate",
        "Deferred without an attempt: a 429 closed its domain to every worker until then.",
    ),
    "limit": Label(
        "Held by a domain limit",
        "Held back without an attempt: its domain is at its crawl-wide limit "
        "(HA_DOMAIN_CONCURRENCY, HA_DOMAIN_RATE).",
    ),
    "revisit": Label(
        "Revisit",
        "A page revisited on a schedule (HA_REVISIT, meta ha_revisit), waiting for its next "
        "visit: a continuous crawl, not a failure.",
    ),
    "proxy": Label(
        "Waiting for a proxy",
        "Sent back without an attempt: no usable proxy (all cooling down, the pool's API "
        "failing, or the proxy refused its credentials).",
    ),
    "dictionary": Label(
        "Waiting for its dictionary",
        "Sent back without an attempt: compacted with a dictionary the crawl's key lacks "
        "(deleted, or lost in a failover), until a worker holding it writes it back.",
    ),
    "unknown": Label("Unknown", "Counted in the total without a class (older data)."),
}


def class_label(name: str) -> Label:
    """The label of failure class *name*; a class of the user's own is shown as it is."""
    return CLASSES.get(name) or Label(name, f"A failure class of the project's own: {name}.")


def counter_label(name: str) -> Label:
    """The label of counter *name* (``retried:<class>`` and ``dead:<class>`` too)."""
    event, _, fclass = name.partition(":")
    if fclass and event in ("retried", "dead"):
        of = class_label(fclass)
        verb = "Retries" if event == "retried" else "Dead-lettered"
        return Label(f"{verb}: {of.text.lower()}", of.meaning)
    return COUNTERS.get(name) or Label(name.replace("_", " ").capitalize(), name)
