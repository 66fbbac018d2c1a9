"""A crawl's compaction dictionary in Redis (``codec.compact``): trained once, by the first
worker of the crawl that has seen enough of its requests, kept for the crawl's life.

Until a dictionary exists a worker stores its requests as plain documents and keeps its
first ``SAMPLES`` of them; then it trains a dictionary from them and writes it to
``<prefix>:{<spider>}:dict`` under an id of its own (derived from its data, one the key
and the worker know no dictionary under) and names it in the field ``current`` if no
other worker did first (one script, ``lua/dictionary.lua``); every worker compacts with
the current one (but a worker holding one when the key lost it, who keeps it). A dictionary
is never changed nor deleted but with the crawl (``flush``): a payload compacted with it
is read back as long as the crawl exists, dead letters included. Whatever reads payloads
(the worker, the dead-letter tools, the dashboard) reads them through
:class:`Dictionaries`. (Earlier versions stored the one dictionary under id 1 and no
``current``: such a key compacts with 1.)

Should the key lose it (deleted by hand, or a failover to a replica that had not received
it), a worker holding it writes it back (:meth:`Dictionaries.restore`). A worker that
trains one meanwhile stores it under another id (it cannot tell which id the lost one
had until a worker met requests compacted with it: one in 254 lands on it), so the requests
compacted with the lost one are read again once it is back. A frame carries a tag of its
dictionary (:mod:`scrapy_ha.codec.compact`): read with another, it is refused, never read
as another request; a worker whose dictionary's id holds another goes by the key's. (But
an earlier version's dictionary, id 1: its frames carry no tag, so that the workers of that
version, which read no others, read them during a rolling upgrade.)
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import TYPE_CHECKING, Any

import redis

from scrapy_ha.codec.compact import Dictionary, dictionary_id, expand, fresh_id, parse_id, train
from scrapy_ha.codec.summary import training_sample
from scrapy_ha.store.scripts import Registered
from scrapy_ha.store.wire import text

if TYPE_CHECKING:
    from collections.abc import Iterable

    from scrapy_ha.keys import Keys

__all__ = [
    "CURRENT",
    "DICTIONARY_ID",
    "GONE_DELAY",
    "SAMPLES",
    "Compactor",
    "Dictionaries",
]

logger = logging.getLogger(__name__)

#: The id earlier versions stored a crawl's one dictionary under (a key without
#: :data:`CURRENT` compacts with it); a dictionary trained now takes one of 2 to 255.
DICTIONARY_ID = 1
#: The field of the key that names the dictionary new requests are compacted with, and
#: the head of those that say since when one is missing (``gone:<id>``: epoch ms).
CURRENT, GONE = "current", "gone:"
#: Requests a worker keeps before it trains the crawl's dictionary: enough to hold the
#: crawl's URL shapes past its start requests (2 KB is 16 realistic requests: the dictionary
#: keeps the last of them), few enough that the crawl compacts from its first seconds.
SAMPLES = 128
#: Requests offered after which a worker trains from the samples that fit, however few.
TRAIN_AFTER = 4 * SAMPLES
#: Seconds between two looks of a worker holding the crawl's dictionary at the key, to
#: write it back if it is gone (one round trip).
RESTORE_EVERY = 10.0
#: Seconds the requests compacted with a dictionary the key lacks are sent back to wait for
#: it, from when the crawl's workers found it missing (six looks of a worker holding it).
GONE_WAIT = 6 * RESTORE_EVERY
#: Seconds such a request waits in the delayed set each time.
GONE_DELAY = RESTORE_EVERY


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
        #: ids of frames met whose dictionary the key lacks (no new one takes their id)
        self.gone: set[int] = set()
        #: of those, until when their requests wait for them (monotonic; see :meth:`read`)
        self._gone_until: dict[int, float] = {}
        #: the id new requests are compacted with (None: none known yet)
        self.current_id: int | None = None
        self._said: set[int] = set()  # ids said in an ERROR to hold another dictionary

    async def _unless_garbage(self, call: Any) -> Any:
        """*call()*'s result, or None if the key holds another type than a hash (garbage:
        each call failed, and the worker tried again every second for ever, naming no key).
        The key is left as it is, said once in an ERROR: this worker then stores its
        requests uncompacted (:attr:`unusable`), and a payload compacted with a dictionary
        it held is set aside as corrupt. Renaming it would let a worker train another
        dictionary under the same id, and what was compacted with the first one could not
        be read."""
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
                "aside as corrupt a request compacted with a dictionary it does not hold. "
                "Put the dictionaries back from a copy (the tools refuse to read the crawl "
                "meanwhile): the requests compacted with them cannot be read without them; "
                "`scrapy-ha flush` starts the crawl afresh",
                self.key,
            )
        return None

    async def load(self) -> Dictionary | None:
        """Read the crawl's dictionaries; return the one to compact with (None: none yet)."""
        stored = await self._unless_garbage(lambda: self.client.hgetall(self.key)) or {}
        named, has_current = None, False
        for field, data in stored.items():
            if text(field) == CURRENT:
                named, has_current = parse_id(data), True
            elif (dict_id := parse_id(field)) is not None:  # else written by hand
                self.known[dict_id] = data
        if not has_current and DICTIONARY_ID in self.known:  # an earlier version's key
            named = DICTIONARY_ID
        self.current_id = named
        back = [f"{GONE}{i}" for i in self.known if f"{GONE}{i}".encode() in stored]
        if back and self.worker:  # (put back by hand: its wait is over)
            await self.client.hdel(self.key, *back)
        return self.current()

    def has_current(self) -> bool:
        """Whether the dictionary new requests are compacted with is known."""
        return self.current_id is not None and self.current_id in self.known

    def current(self) -> Dictionary | None:
        """The dictionary new requests are compacted with (None: none is known yet). That of
        an earlier version's key (:data:`DICTIONARY_ID`) compacts into untagged frames: its
        workers, still crawling during a rolling upgrade, read no others."""
        dict_id = self.current_id
        data = None if dict_id is None else self.known.get(dict_id)
        if data is None:
            return None
        return Dictionary(dict_id, data, tagged=dict_id != DICTIONARY_ID)  # type: ignore[arg-type]

    async def ensure(self, payloads: Iterable[bytes]) -> None:
        """Read the dictionaries *payloads* were compacted with, those not known yet (a call
        each, none when all are known)."""
        missing = {dictionary_id(p) for p in payloads} - {None, *self.known}
        for dict_id in sorted(i for i in missing if i is not None):
            await self.read(dict_id)

    async def read_current(self) -> None:
        """Read which dictionary is ``current`` (and it, unless known): another worker may
        have published it since :meth:`load`."""
        named = parse_id(await self._unless_garbage(lambda: self.client.hget(self.key, CURRENT)))
        if named is not None:
            if named not in self.known:
                await self.read(named)
            self.current_id = named

    async def read(self, dict_id: int) -> None:
        """Read the dictionary *dict_id*; if the key lacks it, it is :attr:`gone`, and (for a
        worker) its requests wait for it until the crawl's workers have found it missing
        ``GONE_WAIT`` seconds, by Redis's clock (``lua/gone.lua``: a worker's own clock, and
        a wait restarted with each worker, kept requests waiting for ever)."""
        if self.worker:
            gone = Registered(self.client, "gone")
            reply = await self._unless_garbage(partial(gone, keys=[self.key], args=[dict_id]))
            data, since, now = reply if reply is not None else (None, 0, 0)
        else:  # (a tool writes nothing)
            data = await self._unless_garbage(lambda: self.client.hget(self.key, str(dict_id)))
        if data is not None:
            self.known[dict_id] = data
            self.gone.discard(dict_id)
            self._gone_until.pop(dict_id, None)
            return
        if self.worker and dict_id not in self.gone:
            logger.warning(
                "%s lacks compaction dictionary %d: the requests compacted with it wait in "
                "the delayed set for a worker holding it to write it back (%g s at a time, "
                "for %g s since the crawl's workers first found it missing; then they are "
                "set aside as corrupt)",
                self.key,
                dict_id,
                GONE_DELAY,
                GONE_WAIT,
            )
        self.gone.add(dict_id)
        if self.worker:
            waited = (int(now) - int(since)) / 1000
            self._gone_until[dict_id] = time.monotonic() + GONE_WAIT - waited

    def waits_for(self, payload: bytes) -> bool:
        """Whether *payload*, which could not be read, is compacted with a dictionary the key
        has lacked for less than ``GONE_WAIT`` seconds: a worker holding it writes it back
        within ``RESTORE_EVERY`` seconds, so the request waits for it in the delayed set
        (a failover or a deletion set each one leased meanwhile aside as corrupt)."""
        until = self._gone_until.get(dictionary_id(payload))  # type: ignore[arg-type]
        return not self.unusable and until is not None and time.monotonic() < until

    async def restore(self) -> int:
        """Write back the dictionaries this worker knows that the key lacks, and name the
        one it compacts with ``current`` if the key names none; return how many.

        A failover to a replica that had not received the dictionary loses it as it loses
        children (:mod:`scrapy_ha.scheduler.session.lost`), and a key deleted by hand loses
        it too: the requests compacted with it are unreadable to every reader that does not
        hold it. A worker that finds its children lost writes back what it knows before it
        stores them again, and a worker holding the crawl's dictionary looks every
        ``RESTORE_EVERY`` seconds (:meth:`Compactor.settle`). A key that holds another
        dictionary under the same id is said in an ERROR, once (a frame carries a tag of
        its dictionary: a worker refuses the other's frames, it never misreads them)."""
        written = 0
        for dict_id, data in sorted(self.known.items()):
            if self.unusable:  # (garbage in the key: said once, left as it is)
                break
            answer = await self._unless_garbage(partial(self._put_back, dict_id, data))
            if answer is None:
                continue
            put, held = answer
            written += bool(put)
            if held is None or held == data:
                continue
            # another under its id: this worker reads and compacts as every other reader
            # does (the requests compacted with its own are refused by all, and by it)
            self.known[dict_id] = held
            if dict_id == self.current_id:
                self.current_id = None  # (its Compactor takes the key's current)
            if dict_id not in self._said:
                self._said.add(dict_id)
                logger.error(
                    "%s holds another compaction dictionary under id %d than this worker "
                    "held (written by hand, or trained after it was deleted or lost, under "
                    "the same id): the requests compacted with this worker's are refused "
                    "as corrupt (restore the key from a copy to read them), and this "
                    "worker goes by the key's from now on",
                    self.key,
                    dict_id,
                )
        if written:
            logger.warning(
                "%s lacked %d compaction dictionar(ies): written back", self.key, written
            )
        return written

    async def _put_back(self, dict_id: int, data: bytes) -> tuple[bool, bytes | None]:
        """HSETNX the dictionary *dict_id* (and ``current``, if it is this worker's), and
        what the key holds under it then (one round trip)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hsetnx(self.key, str(dict_id), data)
        pipe.hget(self.key, str(dict_id))
        pipe.hdel(self.key, f"{GONE}{dict_id}")  # (back: the crawl's wait for it ends)
        if dict_id == self.current_id:
            pipe.hsetnx(self.key, CURRENT, str(dict_id))
        put, held, *_ = await pipe.execute()
        return bool(put), held

    def expand(self, stored: bytes) -> bytes:
        """The document of a stored payload (see :func:`~scrapy_ha.codec.compact.expand`;
        raises ``CodecError`` when its dictionary is not known after :meth:`ensure`)."""
        return expand(stored, self.known)

    async def publish(self, data: bytes) -> Dictionary | None:
        """Store *data* as the crawl's dictionary unless one is named ``current`` already;
        return the current one (another worker's, if it was first); None if the key is
        unusable, or names a dictionary it lacks (said once).

        *data* goes under an id the key holds no dictionary under, nor this worker knew
        (one it met requests compacted with, the key lacking it, among them): a dictionary
        lost and written back later, or restored from a copy, then reads its requests
        again (an earlier version trained again under id 1, and they were refused)."""
        fields = await self._unless_garbage(lambda: self.client.hkeys(self.key))
        if fields is None:
            return None
        ids = (parse_id(text(f).removeprefix(GONE)) for f in fields)  # (a lost one's too)
        taken = {i for i in ids if i is not None} | {*self.known, *self.gone}
        publish = Registered(self.client, "dictionary")
        answer = None
        while answer is None:  # (an id another worker took meanwhile: the next one)
            dict_id = fresh_id(data, taken)
            if dict_id is None:
                why = "holds 254 dictionaries: no id is left for another"
                self._refuse(why, "`scrapy-ha flush` starts the crawl afresh")
                return None
            answer = await self._unless_garbage(
                partial(publish, keys=[self.key], args=[dict_id, data])
            )
            if self.unusable:  # (said once)
                return None
            taken.add(dict_id)
        named, stored = parse_id(answer[0]), answer[1]
        if named is None or stored is None:
            why = f"names {text(answer[0])!r} current, which it does not hold"
            self._refuse(why, f"restore the key from a copy, or delete its `{CURRENT}` field")
            return None
        self.known[named] = stored
        self.current_id = named
        return self.current()

    def _refuse(self, why: str, fix: str) -> None:
        """The key cannot name a dictionary for this worker (*why*, then *fix*): said once,
        and the worker stores its requests uncompacted (:attr:`unusable`)."""
        if not self.unusable:
            self.unusable = True
            logger.error(
                "%s %s: this worker stores its requests uncompacted until it starts again (%s)",
                self.key,
                why,
                fix,
            )


class Compactor:
    """What a worker compacts its new requests with (:meth:`pending`, as a round sends
    those that go pending, with no I/O): nothing until the crawl has a dictionary,
    meanwhile its first requests are kept to train one (:meth:`sample`, as each is
    admitted; :attr:`wants_dictionary`, for the session)."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.dictionary: Dictionary | None = None
        self.samples: list[bytes] = []
        self.offered = 0  # requests offered as samples (trained from when too few fit)
        self._restored = time.monotonic()  # when the key was last looked at (restore)

    def sample(self, payload: bytes) -> None:
        """Keep *payload* (a document) to train the crawl's dictionary, while it has none
        (its secrets masked: :func:`~scrapy_ha.codec.summary.training_sample`), if the
        training would take it: a crawl whose first requests were all larger than
        ``SAMPLE_MAX_BYTES`` trained an empty dictionary from them, the crawl's for good."""
        if self.enabled and self.dictionary is None and len(self.samples) < SAMPLES:
            self.offered += 1
            if sample := training_sample(payload):
                self.samples.append(sample)

    def pending(self, payload: bytes) -> bytes:
        """*payload* as it goes pending: compacted once the crawl has a dictionary, unless
        it is compacted already (an entry a round sends again)."""
        dictionary = self.dictionary
        if dictionary is None or dictionary_id(payload) is not None:
            return payload
        return dictionary.compact(payload)

    @property
    def wants_dictionary(self) -> bool:
        """Whether enough requests were seen to train the crawl's dictionary: ``SAMPLES``
        that fit, or ``TRAIN_AFTER`` offered (a crawl of large requests: whatever fit)."""
        enough = len(self.samples) >= SAMPLES or self.offered >= TRAIN_AFTER
        return self.enabled and self.dictionary is None and enough

    def adopt(self, dictionary: Dictionary | None) -> None:
        """Compact with *dictionary* from now on (when compaction is on)."""
        if self.enabled and dictionary is not None:
            self.dictionary = dictionary
            self.samples = []

    async def settle(self, dictionaries: Dictionaries | None) -> None:
        """Train and publish the crawl's dictionary once enough requests were seen, or
        adopt the one another worker published (looked for every ``RESTORE_EVERY``
        seconds); nothing while the worker is not connected (no *dictionaries*). A worker
        holding one writes it back as often, should the key have lost it (deleted, or lost
        in a failover)."""
        if not self.enabled or dictionaries is None:
            return
        now = time.monotonic()
        if due := now - self._restored >= RESTORE_EVERY:  # a look at the key
            self._restored = now
        held = self.dictionary
        if held is not None:
            if due:
                await dictionaries.restore()
            if dictionaries.unusable:  # garbage in the key (said once): no reader has it
                self.enabled, self.dictionary = False, None
                return
            if not due or dictionaries.known.get(held.id) == held.data:
                return
            self.dictionary = None  # another under its id (said): it takes the key's current
        if due and not dictionaries.has_current():
            await dictionaries.read_current()
        current = dictionaries.current()
        if current is not None:
            self.adopt(current)
        elif self.wants_dictionary:
            self.adopt(await dictionaries.publish(train(self.samples)))
            if dictionaries.unusable:  # (said once): no dictionary for this worker
                self.enabled = False
                self.samples.clear()
