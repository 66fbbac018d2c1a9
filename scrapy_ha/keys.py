"""Every Redis key scrapy-ha uses, built in one place.

All keys of one crawl share the Redis Cluster hash tag ``{<spider>}`` so that
every Lua script touches a single slot. With the default prefix ``ha`` and a
spider named ``books`` the keys are:

=========================  ===========  ==================================================
key                        type         content
=========================  ===========  ==================================================
``ha:{books}:q:<qid>``      list         a back queue: one host's pending requests at one
                                        priority, in order (lua/lib/frontier.lua)
``ha:{books}:ready``       sorted set   qid -> score of its head: the back queues that may go
``ha:{books}:waiting``     sorted set   qid -> time (ms) the back queue is looked at again
``ha:{books}:ready:relink`` string     renames of ``ready``/``waiting`` set aside whose back
                                        queues wait to be relinked (store/frontier.py)
``ha:{books}:queued``      string       the number of requests in the back queues
``ha:{books}:pending``     sorted set   (a crawl of an earlier version: converted at start)
``ha:{books}:payload``     hash         entry id -> request (leased, delayed, dead: ``codec``)
``ha:{books}:leased``      sorted set   entry id -> lease expiry (Redis server time, ms)
``ha:{books}:leases``      hash         entry id -> ``"<token> <pending score> <domain>"``, then
                                        `` h`` once handed to the worker's engine; a token
                                        is ``<random nonce>-<lseq>.<n>``: never given twice,
                                        even after a flush or a failover (a request the
                                        worker handed out before Redis had it: id
                                        ``<worker nonce>.<n>``, token ``<worker nonce>-<n>``)
``ha:{books}:expiries``    hash         entry id -> ``"<counted> <all>"``: expired leases of
                                        the request once handed to an engine (toward
                                        poison), and all of them
``ha:{books}:delayed``     sorted set   entry id -> due time (ms); promoted when due
``ha:{books}:delayed_sc``  hash         entry id -> ``"<score> <host>"``: its place, promoted
``ha:{books}:held``        hash         delayed entry id -> why it waits without an attempt:
                                        ``<why> <domain>`` (lib/held), until due;
                                        ``#<why> <domain>`` -> how many
``ha:{books}:dead``        sorted set   entry id -> time it was dead-lettered (ms)
``ha:{books}:dead_info``   hash         entry id -> JSON: class, reason, attempts, history
``ha:{books}:dead_arch``   hash         entry id -> ``"<dead-letter time (ms)> <sink id>
                                        ..."``: the version copied and each SQL archive that
                                        holds it (store/lua/archived.lua); field
                                        ``~sink:<sink id>`` -> the database and table it
                                        names, without credentials; field ``~archive`` (the
                                        URL declared last, password hidden): retention and
                                        purge keep entries no archive holds yet
``ha:{books}:dlq_alert``   string       the dead-letter alert of this crawl: pending (TTL), sent
``ha:{books}:buckets``     hash         the exact dupefilter's ``buckets``, ``gen``, ``n``; its
                                        intsets ``buckets:<gen>:<i>`` (store/buckets.py)
``ha:{books}:dupefilter``  set          a crawl made before the buckets: fingerprints seen
``ha:{books}:bloom``       hash         ``HA_DUPEFILTER = "bloom"``: the filter in place of the
                                        set, its bitmaps ``bloom:<layer>:<part>`` (lib/bloom);
                                        with a TTL, its time slices' ``bloom:s<i>:<l>:<p>``
``ha:{books}:aged``        hash         with ``HA_DUPEFILTER_TTL``, the dupefilter's time slices
                                        instead (lua/lib/aged.lua): ``s<i>`` -> the start
                                        (ms) of slot ``i``, ``period`` -> TTL / 8 (ms)
``ha:{books}:aged:<i>``    set          the fingerprints first seen while slot ``i`` (0 to 8)
                                        was the newest; dropped whole once it ended a TTL ago
``ha:{books}:forget``      hash         ``scrapy-ha seen forget`` rules (store/forget.py):
                                        ``d <domain>`` or ``p <glob>`` -> when it was made
                                        (ms); ``v`` -> forgets so far
``ha:{books}:revisits``    sorted set   entry id -> due time (ms) of a revisited request's next
                                        visit (lua/revisit.lua; pruned a day past it)
``ha:{books}:revisit_urls`` hash        fingerprint -> the entry id that revisits it (one per
                                        URL, lua/lib/revisit.lua); ``x:<id>`` -> one a copy took
                                        from dead letter ``<id>`` (gone with it, or requeued)
``ha:{books}:revisit_alloc`` hash       adaptive revisits (lib/revisit): sums ``load``,
                                        ``base``, multiplier ``mu``; ``e:<id>``: what
                                        revisit entry ``<id>`` holds in the sums
``ha:{books}:stop``        string       ``scrapy-ha stop``: the time (ms) before which a worker
                                        that joined closes
``ha:{books}:seq``         string       counter for entry ids and FIFO order
``ha:{books}:run``         hash         the crawl's runs (lua/run.lua): ``n`` (1, 2, ...),
                                        ``open`` (1 or 0), ``started``, ``ended``, ``resumed``
                                        (ms), ``ends``, ``acked0``, ``m:<worker>`` -> its run
``ha:{books}:lseq``        string       counter part of lease tokens
``ha:{books}:sent``        hash         a running worker's nonce -> the number of its newest
                                        child stored, ``<nonce>:i`` its newest loose item
                                        (numbered 1, 2, ... as sent: a call sent again after
                                        its reply was lost skips those already handled; a
                                        server behind a worker's newest kept child refuses
                                        its syncs until they are stored again)
``ha:{books}:senders``     hash         worker id -> its nonce in ``sent``, then ``"<nonce>
                                        <ms>"`` once seen gone: both go a day later
``ha:{books}:workers``     sorted set   worker id -> heartbeat expiry (ms)
``ha:{books}:grant:<w>``   hash         entry id -> token of worker ``<w>``'s latest sync's
                                        leases, ``=`` -> its nonce (sync.lua; read by renew.lua)
``ha:{books}:wstats``      hash         worker id -> ``"<last renewal (ms)> <JSON>"``, the JSON
                                        ``{"leases", "rate"}``: leases held, pages per second
``ha:{books}:seen``        sorted set   worker id -> its last heartbeat (ms), kept a week
                                        (``scrapy-ha report`` names a window's workers)
``ha:{books}:paused``      string       set by ``scrapy-ha pause``: workers lease nothing new
``ha:{books}:pressure``    string       (JSON, TTL) while memory is above HA_REDIS_MEMORY_HIGH
``ha:{books}:reclaim``     string       guard: the worker that reclaims this interval
``ha:{books}:feed``        string       guard: the worker feeding start URLs into a sharded crawl
``ha:{books}:gates``       hash         domain -> time (ms) before which it is closed
``ha:{books}:gate_log``    sorted set   domain, ``!domain`` (an open) -> its last change's number
``ha:{books}:limits``      hash         crawl-wide per-domain limits: ``*`` (every domain) or a
                                        domain -> ``"<rate> <concurrency>"`` (0 = none),
                                        written by each worker at start
``ha:{books}:polite``      hash         the limits' state: ``n:<domain>`` -> leases holding a
                                        concurrency slot, ``t:<domain>`` -> time (ms) its
                                        next request may start, ``w:<domain>`` -> queues
                                        waiting for a slot, ``<entry id>`` -> domain of a
                                        lease holding a slot
``ha:{books}:proxy_cd``    hash         proxy ``[<digest of its user>@]host:port`` (every
                                        site), ``... site`` (a site banned it) -> end (ms)
``ha:{books}:cp:<task>``   string       a task's pagination checkpoint (JSON), with a TTL
``ha:{books}:cpa:<task>``  hash         page number -> checkpoint of a page of the task that
                                        completed while an earlier one had not (JSON), TTL
``ha:{books}:cookies``     hash         ``jar:<cookiejar key as JSON>`` -> the jar's cookies (JSON,
                                        secret: stored nowhere else); ``v:<key>`` -> its version;
                                        TTL ``HA_COOKIES_TTL``; cleared by a finish (a persisted
                                        crawl's keeps no session cookie)
``ha:{books}:retried``     hash         entry id -> retries of its current life, while it is
                                        not finished (tells a retry that succeeded from a
                                        first try at the ack)
``ha:{books}:stats``       hash         crawl-wide counters (only ever increase): ``enqueued``,
                                        ``filtered``, ``start_duplicates``, ``acked``,
                                        ``reclaimed``, ``poison``,
                                        ``retried``, ``retried:<class>``, ``dead``,
                                        ``dead:<class>``, ``retry_ok``, ``retry_dead``,
                                        ``requeued``, ``purged``
``ha:{books}:stats:min``   hash         ``<event>:<minute>`` -> count in that minute (server ms
                                        // 60000), event ``acked``, ``enqueued``, ``retried``,
                                        ``dead``, ``requeued``, ``purged``, and
                                        ``retried:<class>``, ``dead:<class>``; kept a day;
                                        ``<name>:last`` -> its newest minute (pruning)
``ha:{books}:stats:domain`` hash       ``<domain>`` TAB ``<event>`` -> count, event
                                        ``enqueued``, ``acked``, ``retried``, ``dead``
``ha:{books}:items``       stream       with ``HA_ITEMS = "outbox"``: the items a page
                                        yielded, added by the script call that acks the
                                        page (never by a stale one): entry ``<ms>-<seq>``
                                        -> field ``i``, the item as the codec's tagged JSON;
                                        read by consumer groups (one per sink), an entry
                                        deleted once every group acknowledged it
``ha:{books}:items_aside`` stream       entries a sink cannot write: ``e`` id, ``g`` group,
                                        ``r`` reason, ``t`` ms, ``i`` item (items_aside.lua)
``ha:{books}:items_tries`` hash         ``<entry id> <group>`` -> single writes begun
=========================  ===========  ==================================================

Start URLs are read from scrapy-redis's ``<spider>:start_urls`` list (setting
``REDIS_START_URLS_KEY``), which is outside the hash tag: see the README for Redis Cluster.

Sharded crawls (``HA_SHARDS = N`` > 1, see docs/scaling.md): shard ``i`` has the whole
key set above under the tag ``{<spider>:<i>}`` (``ha:{books:0}:ready`` ...
``ha:{books:5}:ready``), so that the crawl spreads over N cluster slots while every
script still touches one. A request lives in the shard of its fingerprint (each
fingerprint is only ever checked in one dupefilter), a request of a checkpointed task in
its task's shard, a request never filtered in the next shard in turn. What is crawl-wide
stays on shard 0, whose keys every tool reads as the crawl's own: ``paused`` (one key
stops every shard), ``workers`` and ``wstats`` (one heartbeat per worker; the other shards'
are refreshed by the same renewals but only shard 0's are read), ``gates``, ``proxy_cd``,
``cookies`` and ``dlq_alert``. Each shard has its own ``items`` stream (a page's items
go where its ack goes); a sink reads every shard's. A task's ``cp:<task>`` and ``cpa:<task>``
live in the task's shard, by its pages' leases (checkpoint.lua checks one in the same call).

The crawl as a whole, under its own tag (read before the layout is known; a worker joins
through them, ``join.lua``):

=========================  ===========  ==================================================
``ha:{books}:shards``      string       the layout: ``"<count>"`` (``HA_SHARDS``, by the
                                        first worker; absent for one shard), or ``"<count>
                                        <span>"``: shards ``count`` .. ``span - 1`` keep what
                                        an earlier finished run kept there (read, never
                                        placed in). Another count is refused unless the
                                        crawl finished
``ha:{books}:finish``      string       ``"prepare|commit <token> <deadline>"`` while a
                                        sharded finish checks, then clears, the shards
                                        (joins wait); ``"done"`` once a finish cleared the
                                        crawl; deleted when a worker joins
``ha:{books}:joins``       sorted set   a sharded crawl's workers -> end of their join (ms)
``ha:{books}:dict``        hash         dictionary id -> a zlib dictionary, ``current`` -> the
                                        id to compact with, ``gone:<id>`` -> missing since
``ha:{books}:filter``      string       the dupefilter's kind (``set``, ``bloom``, either with
                                        `` sliced`` for ``HA_DUPEFILTER_TTL``): set by the
                                        first worker (NX); a worker of another kind is refused
=========================  ===========  ==================================================
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import overload

__all__ = ["DEFAULT_PREFIX", "Keys", "shard_of", "task_shard"]

#: Default key prefix (setting ``HA_KEY_PREFIX``).
DEFAULT_PREFIX = "ha"
#: The keys of a crawl (of one shard of it) but its checkpoints, by property name.
SHARD_KEYS = (
    "ready waiting queued legacy_pending payload leased leases expiries delayed delayed_score "
    "held dead dead_info dead_archived dlq_alert dupefilter buckets bloom aged forget revisits "
    "revisit_urls revisit_alloc stop seq run lease_seq sent senders workers worker_stats seen "
    "paused pressure reclaim_guard feed_guard gates gate_log domain_limits polite "
    "proxy_cooldowns cookies retried stats stats_minutes stats_domains items items_aside "
    "items_tries"
).split()

#: Time slices that cover the dupefilter's age (``HA_DUPEFILTER_TTL``, lua/lib/aged.lua): 8
#: keep a URL's age within an eighth of the TTL, for 9 set lookups per new request at most.
SEEN_SLICES = 8

#: Bytes of the request fingerprint the dupefilter is sent: 12 (96 bits), of which its buckets
#: keep 64 + log2(buckets) >= 76 bits (store/buckets.py: odds ~1e-8 at a billion URLs).
FINGERPRINT_BYTES = 12
#: Leading bytes of a fingerprint read as the shard number: 32 bits of a SHA-1 are uniform.
PLACEMENT_BYTES = 4


def shard_of(fingerprint: bytes, shards: int) -> int:
    """The shard of a request with this fingerprint: stable, so a fingerprint is only ever
    checked in one shard's dupefilter."""
    return int.from_bytes(fingerprint[:PLACEMENT_BYTES], "big") % shards


def task_shard(task: str, shards: int) -> int:
    """The shard of a checkpointed task: its pages and its checkpoint keys."""
    return shard_of(hashlib.sha1(task.encode()).digest(), shards)  # noqa: S324 (placement)


class _Key:
    """A key of one crawl (of one shard of it), by its name: ``Keys.pending`` is
    ``<prefix>:{<tag>}:pending`` (see :meth:`Keys._key`)."""

    def __init__(self, name: str, *, crawl: bool = False) -> None:
        self.name = name
        self.crawl = crawl  # a key of the crawl as a whole: its own tag, whatever the shard

    @overload
    def __get__(self, keys: None, owner: type[Keys]) -> _Key: ...
    @overload
    def __get__(self, keys: Keys, owner: type[Keys]) -> str: ...
    def __get__(self, keys: Keys | None, owner: type[Keys]) -> str | _Key:
        if keys is None:
            return self
        return (
            f"{keys.prefix}:{{{keys.spider}}}:{self.name}" if self.crawl else keys._key(self.name)
        )


@dataclass(frozen=True)
class Keys:
    """The names of the Redis keys of one crawl (of one shard of it when *shard* is set)."""

    prefix: str
    spider: str
    #: None: the crawl is not sharded (the tag is the spider's name alone)
    shard: int | None = None
    shards: int = 1  # where new requests are placed (HA_SHARDS)
    span: int = 0  # the shards the keys are on, when a finished run had more (0: shards)

    def every_shard(self) -> list[Keys]:
        """The keys of each shard the crawl's keys are on (itself when not sharded)."""
        if self.shard is None:
            return [self]
        return [self.of_shard(i) for i in range(max(self.span, self.shards))]

    @property
    def tag(self) -> str:
        """The hash tag of this shard's keys."""
        return self.spider if self.shard is None else f"{self.spider}:{self.shard}"

    def _key(self, name: str) -> str:
        return f"{self.prefix}:{{{self.tag}}}:{name}"

    def of_shard(self, shard: int) -> Keys:
        """The keys of another shard of the same crawl."""
        return Keys(self.prefix, self.spider, shard, self.shards, self.span)

    #: The keys of the crawl as a whole (see the second table above).
    shard_count, finish_record, joins = (_Key(n, crawl=True) for n in ("shards", "finish", "joins"))
    dictionaries = _Key("dict", crawl=True)  # every shard's compaction dictionaries
    filter_kind = _Key("filter", crawl=True)  # the dupefilter's kind, claimed by the first worker

    def crawl_keys(self) -> list[str]:
        """The keys of the crawl as a whole, for ``flush``."""
        crawl = [self.shard_count, self.finish_record, self.joins, self.dictionaries]
        return [*crawl, self.filter_kind]

    def _task_key(self, name: str, task: str) -> str:
        if self.shard is None:
            return self._key(f"{name}:{task}")
        return f"{self.prefix}:{{{self.spider}:{task_shard(task, self.shards)}}}:{name}:{task}"

    #: The back queues that may go, that wait, their requests' count (and the old pending set).
    ready, waiting, queued = _Key("ready"), _Key("waiting"), _Key("queued")
    legacy_pending = _Key("pending")
    payload = _Key("payload")
    leased = _Key("leased")
    leases = _Key("leases")
    expiries = _Key("expiries")
    delayed = _Key("delayed")
    delayed_score = _Key("delayed_sc")
    #: Delayed entries waiting without an attempt: entry id -> ``gate|revisit <domain>``.
    held = _Key("held")
    dead, dead_info, dead_archived = _Key("dead"), _Key("dead_info"), _Key("dead_arch")
    dlq_alert = _Key("dlq_alert")
    dupefilter = _Key("dupefilter")
    buckets = _Key("buckets")  # the exact dupefilter's buckets (store/buckets.py)
    bloom = _Key("bloom")  # HA_DUPEFILTER = "bloom": the filter (its bitmaps: bloom_part)
    #: With HA_DUPEFILTER_TTL, the dupefilter's time slices: each slot's start (lua/lib/aged).
    aged = _Key("aged")

    def aged_slices(self) -> list[str]:
        """The sets of the dupefilter's time slots, slot 0 first."""
        return [self._key(f"aged:{i}") for i in range(SEEN_SLICES + 1)]

    forget = _Key("forget")  # the ``seen forget`` rules (store/forget.py)
    #: Revisits: each revisited entry's next due time, the entry that revisits each URL,
    #: adaptive revisits' budget (lua/lib/revisit.lua).
    revisits, revisit_urls = _Key("revisits"), _Key("revisit_urls")
    revisit_alloc = _Key("revisit_alloc")
    #: ``scrapy-ha stop``: when the crawl was stopped.
    stop = _Key("stop")
    seq = _Key("seq")
    #: The crawl's runs: which one is in progress (see lua/run.lua).
    run = _Key("run")
    lease_seq = _Key("lseq")
    #: The number of each running worker's newest child stored (see sync.lua).
    sent = _Key("sent")
    senders = _Key("senders")
    workers, worker_stats = _Key("workers"), _Key("wstats")
    #: Workers seen lately: worker id -> last heartbeat (ms), kept a week.
    seen = _Key("seen")

    @property
    def queues(self) -> str:
        """The prefix of the back queues' names, which carries the crawl's hash tag."""
        return self._key("q:")

    def queue(self, qid: str) -> str:
        """The back queue *qid* (``<priority>[s]:<host>``)."""
        return self.queues + qid

    def renew_keys(self) -> list[str]:
        """The keys of renew.lua, in its KEYS order (the optional grant goes after)."""
        return [self.leased, self.leases, self.workers, self.worker_stats, self.seen]

    paused = _Key("paused")
    #: Set (with a TTL) while Redis's memory is above the back-pressure mark.
    pressure = _Key("pressure")
    reclaim_guard = _Key("reclaim")
    #: Set while one worker feeds start URLs into a sharded crawl (see _shards).
    feed_guard = _Key("feed")
    gates = _Key("gates")
    gate_log = _Key("gate_log")  # a sync returns the gates changed since its worker's number
    #: Crawl-wide per-domain limits (see :mod:`scrapy_ha.config.politeness`).
    domain_limits = _Key("limits")
    #: The state of the per-domain limits: slots held, next start times.
    polite = _Key("polite")
    proxy_cooldowns = _Key("proxy_cd")
    cookies = _Key("cookies")
    retried = _Key("retried")
    #: Crawl-wide counters, kept by the scripts that make the transitions.
    stats = _Key("stats")
    #: Per-minute buckets of the counters that have rates (kept for a day).
    stats_minutes = _Key("stats:min")
    stats_domains = _Key("stats:domain")  # per-domain counters

    #: The items committed with their pages' acks (``HA_ITEMS = "outbox"``), those set aside.
    items, items_aside, items_tries = _Key("items"), _Key("items_aside"), _Key("items_tries")

    def stats_keys(self) -> list[str]:
        """The three hashes of the crawl-wide counters, in the order the scripts take them."""
        return [self.stats, self.stats_minutes, self.stats_domains]

    def bloom_part(self, layer: int, part: int) -> str:
        """One bitmap of the Bloom filter: part *part* of layer *layer*."""
        return self._key(f"bloom:{layer}:{part}")

    def checkpoint(self, task: str) -> str:
        """A task's checkpoint: in its task's shard when the crawl is sharded."""
        return self._task_key("cp", task)

    def checkpoint_ahead(self, task: str) -> str:
        """The checkpoints of a task's pages that completed before an earlier page did."""
        return self._task_key("cpa", task)

    def grant(self, worker: str) -> str:
        """The leases of a worker's latest sync, for its lease keeper (expires on its own)."""
        return self._key(f"grant:{worker}")

    @property
    def checkpoint_pattern(self) -> str:
        """A SCAN pattern of every checkpoint key of the crawl (its task follows ``}:cp:``)."""
        tag = self.spider if self.shard is None else f"{self.spider}:[0-9]*"
        prefix = "".join(f"\\{c}" if c in "\\*?[]" else c for c in self.prefix)
        return f"{prefix}:\\{{{tag}\\}}:cp:*"

    def types(self) -> dict[str, str]:
        """The Redis type each key must have (a key of another type is set aside)."""
        from scrapy_ha.key_types import key_types

        return key_types(self)

    def all(self) -> list[str]:
        """Every key of the crawl but its checkpoints and its back queues, for ``flush``."""
        return [*(getattr(self, name) for name in SHARD_KEYS), *self.aged_slices()]
