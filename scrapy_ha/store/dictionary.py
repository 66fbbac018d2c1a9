"""A crawl's compaction dictionary in Redis (``codec.compact``): trained once, by the first
worker of the crawl that has seen enough of its requests, kept for the crawl's life.

Until a dictionary exists a worker stores its requests as plain documents and keeps its
first ``SAMPLES`` of them; then it trains a dictionary from them and writes it to
``<prefix>:{<spider>}:dict`` under id 1 if no other worker did first (HSETNX), and every
worker compacts with the one stored. A dictionary is never changed nor deleted but with
the crawl (``flush``): a payload compacted with it is read back as long as the crawl
exists, dead letters included. Whatever reads payloads (the worker, the dead-letter tools,
the dashboard) reads them through :class:`Dictionaries`.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any

import redis

from scrapy_ha.codec.compact import Dictionary, dictionary_id, expand, train

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from scrapy_ha.keys import Keys

__all__ = [
    "DICTIONARY_ID",
    "SAMPLES",
    "Compactor",
    "Dictionaries",
    "read_payload_sync",
    "read_payloads",
]

logger = logging.getLogger(__name__)

#: The id of a crawl's dictionary: one per crawl (ids 2 to 255 are left for a dictionary
#: trained again, should a crawl's requests change shape).
DICTIONARY_ID = 1
#: Requests a worker keeps before it trains the crawl's dictionary: enough to hold the
#: crawl's URL shapes past its start requests (2 KB is 16 realistic requests: the dictionary
#: keeps the last of them), few enough that the crawl compacts from its first seconds.
SAMPLES = 128


class Dictionaries:
    """The dictionaries of one crawl, read from Redis as payloads need them."""

    def __init__(self, client: Any, keys: Keys, *, worker: bool = False) -> None:
        self.client = client
        self.key = keys.dictionaries
        #: a worker's: a key of another type leaves it uncompacted (a tool's reads fail)
        self.worker = worker
        #: the key holds another type of data (see :meth:`_unless_garbage`)
        self.unusable = False
        #: id -> data of the dictionaries read so far
        self.known: dict[int, bytes] = {}

    async def _unless_garbage(self, call: Any) -> Any:
        """*call()*'s result, or None if the key holds another type than a hash (garbage:
        each call failed, and the worker tried again every second for ever, naming no key).
        The key is left as it is, said once in an ERROR: this worker then stores its
        requests uncompacted (:attr:`unusable`), and a payload compacted with a dictionary
        it held is set aside as corrupt. Renaming it would let a worker train another
        dictionary under the same id, and read what was compacted with the first one as
        other requests."""
        try:
            return await call()
        except redis.exceptions.ResponseError as exc:
            if not self.worker or "WRONGTYPE" not in str(exc):
                raise
        if not self.unusable:
            self.unusable = True
            logger.error(
                "%s holds another type of data than the crawl's compaction dictionaries: "
                "this worker stores its requests uncompacted until it starts again, and sets "
                "aside as corrupt a request compacted with a dictionary kept there. Restore "
                "the key from a copy; do not delete it while the crawl holds compacted "
                "requests (a new dictionary would be trained under the same id, and they "
                "would read as other requests): `scrapy-ha flush` starts the crawl afresh",
                self.key,
            )
        return None

    async def load(self) -> Dictionary | None:
        """Read the crawl's dictionaries; return the one to compact with (None: none yet)."""
        stored = await self._unless_garbage(lambda: self.client.hgetall(self.key)) or {}
        for field, data in stored.items():
            text = field.decode("latin-1") if isinstance(field, bytes) else str(field)
            if text.isascii() and text.isdigit() and text == str(int(text)):  # else by hand
                self.known[int(text)] = data
        return self.current()

    def current(self) -> Dictionary | None:
        """The dictionary new requests are compacted with (None: none is known yet)."""
        data = self.known.get(DICTIONARY_ID)
        return None if data is None else Dictionary(DICTIONARY_ID, data)

    async def ensure(self, payloads: Iterable[bytes]) -> None:
        """Read the dictionaries *payloads* were compacted with, those not known yet (one
        call when some are missing, none otherwise)."""
        missing = {dictionary_id(p) for p in payloads} - {None, *self.known}
        for dict_id in sorted(i for i in missing if i is not None):
            data = await self._unless_garbage(lambda i=dict_id: self.client.hget(self.key, str(i)))
            if data is not None:
                self.known[dict_id] = data

    async def restore(self) -> int:
        """Write back the dictionaries this worker knows that the key lacks; return how many.

        A failover to a replica that had not received the dictionary loses it as it loses
        children (:mod:`scrapy_ha.scheduler.session.lost`): the requests compacted with
        it would be unreadable to every other reader, and a worker that joined later would
        train another under the same id and read them as other requests. A worker that
        finds its children lost writes back what it knows before it stores them again."""
        written = 0
        for dict_id, data in sorted(self.known.items()):
            if self.unusable:  # (garbage in the key: said once, left as it is)
                break
            put = partial(self.client.hsetnx, self.key, str(dict_id), data)
            if await self._unless_garbage(put):
                written += 1
            elif (held := await self.client.hget(self.key, str(dict_id))) != data and held:
                logger.error(
                    "%s holds another compaction dictionary under id %d than this worker "
                    "compacts with (a worker trained it after a failover lost this one): "
                    "requests compacted with either read as other requests with the other; "
                    "restore the key from a copy",
                    self.key,
                    dict_id,
                )
        if written:
            logger.warning(
                "%s lacked %d compaction dictionar(ies): written back", self.key, written
            )
        return written

    def expand(self, stored: bytes) -> bytes:
        """The document of a stored payload (see :func:`~scrapy_ha.codec.compact.expand`;
        raises ``CodecError`` when its dictionary is not known after :meth:`ensure`)."""
        return expand(stored, self.known)

    async def publish(self, data: bytes) -> Dictionary | None:
        """Store *data* as the crawl's dictionary unless one is stored already; return the
        one stored (another worker's, if it was first); None if the key is unusable."""
        await self._unless_garbage(lambda: self.client.hsetnx(self.key, str(DICTIONARY_ID), data))
        if self.unusable:
            return None
        stored = await self.client.hget(self.key, str(DICTIONARY_ID))
        self.known[DICTIONARY_ID] = stored if stored is not None else data
        current = self.current()
        assert current is not None
        return current


class Compactor:
    """What a worker compacts its new requests with (:meth:`pending`, as a round sends
    those that go pending, with no I/O): nothing until the crawl has a dictionary,
    meanwhile its first requests are kept to train one (:meth:`sample`, as each is
    admitted; :attr:`wants_dictionary`, for the session)."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.dictionary: Dictionary | None = None
        self.samples: list[bytes] = []

    def compact(self, payload: bytes) -> bytes:
        """*payload* compacted, or as it is (and kept as a sample) while no dictionary is
        known."""
        if self.dictionary is not None:
            return self.dictionary.compact(payload)
        self.sample(payload)
        return payload

    def sample(self, payload: bytes) -> None:
        """Keep *payload* (a document) to train the crawl's dictionary, while it has none."""
        if self.enabled and self.dictionary is None and len(self.samples) < SAMPLES:
            self.samples.append(payload)

    def pending(self, payload: bytes) -> bytes:
        """*payload* as it goes pending: compacted once the crawl has a dictionary, unless
        it is compacted already (an entry a round sends again)."""
        dictionary = self.dictionary
        if dictionary is None or dictionary_id(payload) is not None:
            return payload
        return dictionary.compact(payload)

    @property
    def wants_dictionary(self) -> bool:
        """Whether enough requests were seen to train the crawl's dictionary."""
        return self.enabled and self.dictionary is None and len(self.samples) >= SAMPLES

    def adopt(self, dictionary: Dictionary | None) -> None:
        """Compact with *dictionary* from now on (when compaction is on)."""
        if self.enabled and dictionary is not None:
            self.dictionary = dictionary
            self.samples = []

    async def settle(self, dictionaries: Dictionaries | None) -> None:
        """Train and publish the crawl's dictionary once enough requests were seen, or
        adopt one another worker published (read by :meth:`Dictionaries.ensure`); nothing
        while the worker is not connected (no *dictionaries*)."""
        if not self.enabled or self.dictionary is not None or dictionaries is None:
            return
        if self.wants_dictionary:
            self.adopt(await dictionaries.publish(train(self.samples)))
            if dictionaries.unusable:  # (said once): no dictionary for this worker
                self.enabled = False
                self.samples.clear()
        else:
            self.adopt(dictionaries.current())


async def read_payloads(client: Any, keys: Keys, ids: Sequence[str]) -> list[bytes | None]:
    """The payloads of entries *ids* (leased, delayed or dead) as documents: expanded when
    compacted (a frame whose dictionary is gone is returned as it is: readers that rebuild
    or describe it report it unreadable)."""
    if not ids:
        return []
    raw = await client.hmget(keys.payload, list(ids))
    dictionaries = Dictionaries(client, keys)
    await dictionaries.ensure(p for p in raw if p is not None)
    return [None if p is None else _expanded(dictionaries, p) for p in raw]


def _expanded(dictionaries: Dictionaries, payload: bytes) -> bytes:
    try:
        return dictionaries.expand(payload)
    except ValueError:  # CodecError: unreadable, shown as such by whoever describes it
        return payload


def read_payload_sync(client: Any, keys: Keys, entry_id: str) -> bytes | None:
    """:func:`read_payloads` of one entry with a synchronous client."""
    payload: bytes | None = client.hget(keys.payload, entry_id)
    dict_id = None if payload is None else dictionary_id(payload)
    if payload is None or dict_id is None:
        return payload
    data = client.hget(keys.dictionaries, str(dict_id))
    try:
        return expand(payload, {} if data is None else {dict_id: data})
    except ValueError:
        return payload
