"""A webhook alert when a crawl's dead-letter queue grows past a threshold.

``HA_DLQ_ALERT_WEBHOOK`` is a URL that receives one JSON POST per crossing of
``HA_DLQ_ALERT_THRESHOLD`` per crawl: ``{"text": ..., "spider": ..., "dead": N, ...}``. The
``text`` field is what Slack-, Feishu- and DingTalk-style incoming webhooks display; the other
fields are for a receiver of one's own. Which worker sends it is decided in Redis (a marker set
with NX, "pending" until the receiver answered 2xx, then "sent"), so that any number of
workers send it once; once the queue is back below the threshold (a purge, a requeue), the
next crossing alerts again. The POST runs in a thread, bounded as a whole by
:data:`ALERT_TIMEOUT`: an unreachable receiver costs the crawl nothing, and the alert is
not lost. How the POST ended decides when it goes again:

- refused (4xx, 5xx), or nothing sent (no connection made): a failure
  (``ha/alert/errors``); the marker is taken back at once (if it is still this worker's),
  and the next dead letter past the threshold sends it again;
- the request went out but no whole answer came (a receiver that reads it and answers
  late, or one that never reads: the request fit the kernel's buffers, nothing more is
  known): ``ha/alert/unanswered``; the pending marker is left to expire after
  :data:`PENDING_TTL`, so that the alert goes again at most once in that time (a slow
  receiver gets a duplicate a minute at most, not one at every dead letter);
- the answer began (a byte of it came) but did not end in time: it may have been
  delivered; recorded as sent, never sent again for this crossing
  (``ha/alert/unconfirmed``, a WARNING).

A worker killed before the answer leaves a pending marker that expires after
:data:`PENDING_TTL` too.
"""

from __future__ import annotations

__all__ = [
    "ALERT_TIMEOUT",
    "DEFAULT_ALERT_THRESHOLD",
    "PENDING_TTL",
    "DeadLetterAlert",
    "Unanswered",
    "Unconfirmed",
    "post_json",
    "queue_shrunk",
]

import asyncio
import json
import logging
import re
import socket
import time
import uuid
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio

from scrapy_ha.config import validate as check
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.deadletters._post import ALERT_TIMEOUT, Unanswered, Unconfirmed, post_json
from scrapy_ha.store import scripts
from scrapy_ha.store.sharding import shard_setting

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings
    from scrapy.statscollectors import StatsCollector

    from scrapy_ha.keys import Keys
    from scrapy_ha.store.queue import RedisQueue

logger = logging.getLogger(__name__)

#: Dead letters that trigger the alert: a few gone pages are routine in a crawl, a hundred
#: dead requests are a pattern (a ban, a site change) worth a look while the crawl runs.
DEFAULT_ALERT_THRESHOLD = 100
#: Seconds a pending marker lives when its worker never said how the POST went (killed, or
#: Redis unreachable then): several times the POST's, short enough that the alert comes a
#: minute late at most.
PENDING_TTL = 60.0


def _where(url: str) -> str:
    """Scheme and host of *url*: a webhook's path is often its secret token, so is its
    user info (read without urlsplit, which raises on a host it cannot read)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    authority, *path = re.split(r"[/?#]", rest, maxsplit=1)
    if "@" in authority or (":" in authority and "@" in rest):  # user info, its password
        # perhaps holding '/', '?' or '#' unencoded: the host follows the last '@'
        authority, *path = re.split(r"[/?#]", rest.rpartition("@")[2], maxsplit=1)
        authority = f"***@{authority}"
    return f"{scheme}{sep}{authority}" + ("/..." if path else "")


class DeadLetterAlert:
    """Sends the dead-letter alert of one worker's crawl (see the module's docstring)."""

    def __init__(self, url: str, threshold: int, stats: StatsCollector, worker: str = "") -> None:
        self.url = url
        self.threshold = threshold
        self.stats = stats
        self.worker = worker or socket.gethostname()
        self._tasks: set[asyncio.Task[None]] = set()
        self.shards = 1  # (HA_SHARDS: each shard keeps HA_DLQ_MAX_ENTRIES dead letters)

    @classmethod
    def from_settings(cls, settings: BaseSettings, stats: StatsCollector) -> DeadLetterAlert | None:
        """The alert *settings* ask for (``HA_DLQ_ALERT_WEBHOOK``), or None."""
        url = check.text(settings, "HA_DLQ_ALERT_WEBHOOK", "")
        if not url:
            return None
        if not url.startswith(("http://", "https://")):
            raise ConfigError(
                f"HA_DLQ_ALERT_WEBHOOK={_where(url)!r} must be an http:// or https:// URL "
                f"(the incoming webhook of a chat channel, or a receiver of your own)"
            )
        parts = check.url_parts("HA_DLQ_ALERT_WEBHOOK", url, _where(url))
        try:
            parts.port  # noqa: B018 - a port that is not one is refused when it is read
        except ValueError:  # (its message would echo the text read as a port)
            raise ConfigError(
                f"HA_DLQ_ALERT_WEBHOOK={_where(url)!r}: its port is not a number from 1 to "
                f"65535 (percent-encode '/', '?' and '#' in a password)"
            ) from None
        threshold = check.whole(settings, "HA_DLQ_ALERT_THRESHOLD", DEFAULT_ALERT_THRESHOLD)
        alert = cls(url, threshold, stats, check.text(settings, "HA_WORKER_ID", ""))
        alert.shards = shard_setting(settings)
        return alert

    def warn_if_unreachable(self, max_entries: int, *, archive: bool = False) -> None:
        """A WARNING at start when the dead-letter queue can never reach the threshold (with
        an SQL *archive*, only while entries wait to be archived: retention keeps those)."""
        if self.threshold <= max_entries * self.shards:
            return
        if archive:  # (a QA run: "can never be sent", and it was, the archive behind)
            logger.warning(
                "HA_DLQ_ALERT_THRESHOLD=%d is more than HA_DLQ_MAX_ENTRIES=%d: the dead-letter "
                "queue holds that many only while entries wait for the SQL archive "
                "(HA_DLQ_ARCHIVE_URL), so the alert is sent only then; lower the threshold "
                "or keep more entries",
                self.threshold,
                max_entries,
            )
            return
        logger.warning(
            "HA_DLQ_ALERT_THRESHOLD=%d is more than HA_DLQ_MAX_ENTRIES=%d: the dead-letter "
            "queue never holds that many, so the alert can never be sent; lower the "
            "threshold or keep more entries",
            self.threshold,
            max_entries,
        )

    async def check(self, queue: RedisQueue) -> None:
        """After a dead letter: send the alert if this worker is the one to (Redis errors are
        raised to the caller, like the dead letter's own). The POST's time starts here, as
        the pending marker's does: a thread that starts late (a busy executor) has less."""
        start = time.monotonic()
        marker = self._marker("pending")
        args = [self.threshold, marker, int(PENDING_TTL * 1000)]
        size = await _summed(queue.client, queue.keys)
        dead = int(await self._alert_script(queue, "check", *args, *size))
        if dead:
            sending = self._send(queue, dead, marker, start)
            task = asyncio.get_running_loop().create_task(sending)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _marker(self, state: str) -> str:
        """What the marker holds: unique to this worker and this call (compared, never parsed)."""
        doc = {"state": state, "worker": self.worker, "t": int(time.time())}
        doc["threshold"] = self.threshold  # (read by queue_shrunk)
        return json.dumps({**doc, "id": uuid.uuid4().hex})

    @staticmethod
    async def _alert_script(queue: RedisQueue, *args: Any) -> Any:
        keys = queue.keys
        return await queue.client.eval(scripts.ALERT_LUA, 2, keys.dead, keys.dlq_alert, *args)

    def document(self, spider: str, dead: int) -> dict[str, Any]:
        """The JSON the webhook receives."""
        return {
            "text": (
                f"scrapy-ha: the dead-letter queue of {spider} holds {dead} requests "
                f"(threshold {self.threshold}); see `scrapy-ha dlq list {spider}`"
            ),
            "spider": spider,
            "dead": dead,
            "threshold": self.threshold,
            "worker": self.worker,
            "command": f"scrapy-ha dlq list {spider}",
        }

    async def _send(self, queue: RedisQueue, dead: int, marker: str, start: float) -> None:
        spider = queue.keys.spider
        doc = self.document(spider, dead)
        try:
            status = await asyncio.to_thread(post_json, self.url, doc, start=start)
        except Unconfirmed:
            await self._unconfirmed(queue, dead, marker)
            return
        except Unanswered as exc:
            self._unanswered(spider, dead, exc)
            return
        except Exception as exc:  # noqa: BLE001 - an alert that failed costs the crawl nothing
            self.stats.inc_value("ha/alert/errors")
            logger.warning(
                "Could not send the dead-letter alert of %s to HA_DLQ_ALERT_WEBHOOK (%s): %s; "
                "the next dead letter past the threshold sends it again",
                spider,
                _where(self.url),
                exc,
            )
            await self._settle(queue, "failed", marker)
            return
        await self._settle(queue, "sent", marker, self._marker("sent"))
        self.stats.inc_value("ha/alert/sent")
        logger.warning(
            "The dead-letter queue of %s holds %d requests (HA_DLQ_ALERT_THRESHOLD=%d): "
            "alert sent to HA_DLQ_ALERT_WEBHOOK (HTTP %d)",
            spider,
            dead,
            self.threshold,
            status,
        )

    async def _unconfirmed(self, queue: RedisQueue, dead: int, marker: str) -> None:
        """The answer to the POST began, and did not end in time: the receiver may have
        the alert, so it is recorded as sent (never sent again for this crossing)."""
        await self._settle(queue, "sent", marker, self._marker("sent"))
        self.stats.inc_value("ha/alert/unconfirmed")
        logger.warning(
            "The dead-letter alert of %s (%d requests) went to HA_DLQ_ALERT_WEBHOOK (%s) but "
            "its answer did not end within %g s: it may have been delivered, and is not sent again "
            "until the queue goes below HA_DLQ_ALERT_THRESHOLD=%d",
            queue.keys.spider,
            dead,
            _where(self.url),
            ALERT_TIMEOUT,
            self.threshold,
        )

    def _unanswered(self, spider: str, dead: int, exc: Unanswered) -> None:
        """The request went out but no answer came: the receiver may be reading it (a slow
        one), or never will (one that does not read). Its pending marker is left to expire
        (:data:`PENDING_TTL`): the alert goes again, at most once in that time."""
        self.stats.inc_value("ha/alert/unanswered")
        logger.warning(
            "The dead-letter alert of %s (%d requests) went to HA_DLQ_ALERT_WEBHOOK (%s) but "
            "no answer came (%s): it may have been delivered; the first dead letter past "
            "HA_DLQ_ALERT_THRESHOLD=%d once %g s have passed sends it again",
            spider,
            dead,
            _where(self.url),
            exc,
            self.threshold,
            PENDING_TTL,
        )

    async def _settle(self, queue: RedisQueue, *args: str) -> None:
        """Tell Redis how the POST went (a Redis error: the pending marker expires)."""
        try:
            await self._alert_script(queue, *args)
        except (redis.RedisError, OSError) as exc:
            logger.warning(
                "Could not record the dead-letter alert's outcome in Redis (%s): its marker "
                "expires in %d s",
                exc,
                PENDING_TTL,
            )

    async def close(self) -> None:
        """Wait for an alert under way (at most its timeout)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=ALERT_TIMEOUT + 1)


async def queue_shrunk(client: redis.asyncio.Redis, keys: Keys) -> None:
    """After an operator took dead letters out (a purge, a requeue): the alert's marker goes
    if the queue is below the threshold it records, so that the queue growing past it again
    alerts again (a worker's check sees the queue only after its next dead letter, when it
    may be past the threshold already). *keys* may be any shard's of a sharded crawl."""
    home = keys if keys.shard is None else keys.of_shard(0)  # (which holds the marker)
    size = await _summed(client, keys)
    await client.eval(scripts.ALERT_LUA, 2, home.dead, home.dlq_alert, "shrunk", *size)


async def _summed(client: redis.asyncio.Redis, keys: Keys) -> tuple[int | bytes | str, ...]:
    """A sharded crawl's dead letters, every shard's (one call cannot read them: other
    slots), and the marker as it was before they were counted (the script takes away no
    marker set since: see alert.lua); nothing for a crawl of one shard, whose script counts
    them, atomically."""
    if keys.shard is None:
        return ()
    # (the marker apart, first: a pipeline on a cluster may read it after some count)
    seen = await client.get(keys.of_shard(0).dlq_alert) or b""
    pipe = client.pipeline(transaction=False)  # (one round trip, however many shards)
    for shard in keys.every_shard():
        pipe.zcard(shard.dead)
    return sum(await pipe.execute()), seen
