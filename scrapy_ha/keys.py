"""Every Redis key scrapy-ha uses, built in one place.

All keys of one crawl share the Redis Cluster hash tag ``{<spider>}`` so that
every Lua script touches a single slot. With the default prefix ``ha`` and a
spider named ``books`` the keys are:

=========================  ===========  ==================================================
key                        type         content
=========================  ===========  ==================================================
``ha:{books}:pending``     sorted set   ``"<entry id> <serialized request>"`` -> score (priority
                                        first, 2^40 per step, then the sequence: ``seq``
                                        for FIFO, ``2^40 - seq`` for LIFO)
``ha:{books}:payload``     hash         entry id -> serialized request (see ``codec``) of a
                                        leased, delayed or dead entry
``ha:{books}:leased``      sorted set   entry id -> lease expiry (Redis server time, ms)
``ha:{books}:leases``      hash         entry id -> ``"<token> <pending score>"``; a token
                                        is ``<random nonce>-<lseq>``: never given twice,
                                        even after a flush or a failover (a request the
                                        worker handed out before Redis had it: id
                                        ``<worker nonce>.<n>``, token ``<worker nonce>-<n>``)
``ha:{books}:expiries``    hash         entry id -> how many of its leases expired
``ha:{books}:delayed``     sorted set   entry id -> due time (ms); promoted when due
``ha:{books}:delayed_sc``  hash         entry id -> pending score to restore on promotion
``ha:{books}:dead``        sorted set   entry id -> time it was dead-lettered (ms)
``ha:{books}:dead_info``   hash         entry id -> JSON: class, reason, attempts, history
``ha:{books}:dupefilter``  set          request fingerprints (first 12 raw bytes) already seen
``ha:{books}:seq``         string       counter for entry ids and FIFO order
``ha:{books}:lseq``        string       counter part of lease tokens
``ha:{books}:workers``     sorted set   worker id -> heartbeat expiry (ms)
``ha:{books}:reclaim``     string       guard: the worker that reclaims this interval
``ha:{books}:gates``       hash         domain -> time (ms) before which it is closed
``ha:{books}:proxy_cd``    hash         proxy ``host:port`` -> end of its cool-down (ms)
``ha:{books}:cp:<task>``   string       a task's pagination checkpoint (JSON), with a TTL
``ha:{books}:cookies``     hash         ``jar:<cookiejar key as JSON>`` -> the jar's cookies (JSON,
                                        secret: stored nowhere else); ``v:<key>`` -> its version
=========================  ===========  ==================================================

Start URLs are read from scrapy-redis's ``<spider>:start_urls`` list (setting
``REDIS_START_URLS_KEY``), which is outside the hash tag: see the README for
Redis Cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_PREFIX", "Keys"]

#: Default key prefix (setting ``HA_KEY_PREFIX``).
DEFAULT_PREFIX = "ha"


@dataclass(frozen=True)
class Keys:
    """The names of the Redis keys of one crawl."""

    prefix: str
    spider: str

    def _key(self, name: str) -> str:
        return f"{self.prefix}:{{{self.spider}}}:{name}"

    @property
    def pending(self) -> str:
        return self._key("pending")

    @property
    def payload(self) -> str:
        return self._key("payload")

    @property
    def leased(self) -> str:
        return self._key("leased")

    @property
    def leases(self) -> str:
        return self._key("leases")

    @property
    def expiries(self) -> str:
        return self._key("expiries")

    @property
    def delayed(self) -> str:
        return self._key("delayed")

    @property
    def delayed_score(self) -> str:
        return self._key("delayed_sc")

    @property
    def dead(self) -> str:
        return self._key("dead")

    @property
    def dead_info(self) -> str:
        return self._key("dead_info")

    @property
    def dupefilter(self) -> str:
        return self._key("dupefilter")

    @property
    def seq(self) -> str:
        return self._key("seq")

    @property
    def lease_seq(self) -> str:
        return self._key("lseq")

    @property
    def workers(self) -> str:
        return self._key("workers")

    @property
    def reclaim_guard(self) -> str:
        return self._key("reclaim")

    @property
    def gates(self) -> str:
        return self._key("gates")

    @property
    def proxy_cooldowns(self) -> str:
        return self._key("proxy_cd")

    @property
    def cookies(self) -> str:
        return self._key("cookies")

    def checkpoint(self, task: str) -> str:
        return self._key(f"cp:{task}")

    def grant(self, worker: str) -> str:
        """The leases of a worker's latest sync, for its lease keeper (expires on its own)."""
        return self._key(f"grant:{worker}")

    @property
    def checkpoint_pattern(self) -> str:
        """A SCAN pattern of every checkpoint key of the crawl."""
        return self._key("cp:*").replace("{", "\\{").replace("}", "\\}")

    def types(self) -> dict[str, str]:
        """The Redis type each key must have (a key of another type is set aside)."""
        zsets = (self.pending, self.leased, self.delayed, self.dead, self.workers)
        strings = (self.seq, self.lease_seq, self.reclaim_guard)
        types = {key: "hash" for key in self.all()}
        types.update({key: "zset" for key in zsets})
        types.update({key: "string" for key in strings})
        types[self.dupefilter] = "set"
        return types

    def all(self) -> list[str]:
        """Every key of the crawl but its checkpoints, for ``flush``."""
        return [
            self.pending,
            self.payload,
            self.leased,
            self.leases,
            self.expiries,
            self.delayed,
            self.delayed_score,
            self.dead,
            self.dead_info,
            self.dupefilter,
            self.seq,
            self.lease_seq,
            self.workers,
            self.reclaim_guard,
            self.gates,
            self.proxy_cooldowns,
            self.cookies,
        ]
