"""A failover to a replica that lacks the newest writes loses no child.

Redis replicates asynchronously: a primary can confirm a round that stores a page's
children and fail before its replica has them. The page's ack, sent afterwards to the
promoted replica, finds the page's lease there (it was replicated) and used to be
accepted: the children were in no key, and the crawl ended without them. Here the
replica is cut from its primary (``REPLICAOF NO ONE``) after the page is leased and before
its children are stored, then the worker's connection is moved to it: real servers, a
real crawl, and a TCP forwarder standing for the name or address that moves at failover.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import pytest
import redis as redis_lib
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.codec.compact import train
from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import ChildrenLost, NewEntry
from tests import backqueues, redis_servers
from tests.spiders import CatalogueSpider
from tests.test_redis_failover import DEADLINE, IN_FLIGHT, caught_up, crawl_settings, until

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


class Forwarder:
    """A TCP forwarder on loopback to one Redis port; :meth:`switch` sends every new
    connection to another and cuts the open ones (as a failover moves a name)."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.port = 0
        self._open: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def switch(self, port: int) -> None:
        self.target = port
        for writer in list(self._open):
            writer.transport.abort()

    async def stop(self) -> None:
        self.switch(0)
        if self._server is not None:
            self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.transport.abort()
            return
        self._open |= {writer, up_writer}
        await asyncio.gather(
            self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
        )
        self._open -= {writer, up_writer}

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.transport.abort()


class HeldListSpider(CatalogueSpider):
    """The first list page's callback waits for the test before it yields its children,
    and again after, before it returns (and its page is acked)."""

    name = "held"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reached, self.go_on = asyncio.Event(), asyncio.Event()
        self.yielded, self.finish = asyncio.Event(), asyncio.Event()

    async def parse(self, response: Any) -> Any:
        first = response.url.endswith("/list/1")
        if first:
            self.reached.set()
            await self.go_on.wait()
        for output in super().parse(response):
            yield output
        if first:
            self.yielded.set()
            await self.finish.wait()


def _servers(tmp_path: Path) -> tuple[redis_servers.Server, redis_servers.Server]:
    primary = redis_servers.start(tmp_path / "a")
    replica = redis_servers.start(tmp_path / "b", "--replicaof", "127.0.0.1", str(primary.port))
    return primary, replica


async def tear_down(
    forwarder: Forwarder,
    servers: tuple[redis_servers.Server, ...],
    clients: tuple[redis_lib.Redis, ...],
    crawl: asyncio.Future[Any],
) -> None:
    """Stop the forwarder and the servers, close the clients, let the crawl end."""
    await forwarder.stop()
    for server in servers:
        server.kill()
    for client in clients:
        client.close()
    with contextlib.suppress(BaseException):
        await asyncio.wait_for(crawl, 5)


def _replicating(primary: redis_lib.Redis) -> bool:
    info = primary.info("replication")
    return info["connected_slaves"] == 1 and info["slave0"]["state"] == "online"


@pytest.mark.parametrize("compacted", [False, True], ids=["plain", "compacted"])
@deferred_f_from_coro_f
async def test_a_page_acked_on_a_replica_that_lacks_its_children_loses_none(
    tmp_path: Path, site_factory, caplog, compacted
):
    site = site_factory("--pages", "2", "--per-page", "10", "--delay", "0.3")
    primary, replica = _servers(tmp_path)
    a, b = primary.client(), replica.client()
    forwarder = Forwarder(primary.port)
    await forwarder.start()
    keys = Keys("ha", HeldListSpider.name)
    # compacted: the crawl has a compaction dictionary, which the replica will lack too
    data = train(
        [b'{"v":1,"u":"%s/item/%d","cb":"parse_item"}' % (site.url.encode(), n) for n in range(40)]
    )
    if compacted:
        a.hset(keys.dictionaries, "1", data)
    crawler = get_crawler(HeldListSpider, crawl_settings(f"redis://127.0.0.1:{forwarder.port}/0"))
    crawl = asyncio.ensure_future(crawler.crawl_async(base_url=site.url))
    try:
        await until(lambda: _replicating(a), "the replica")
        await until(lambda: crawler.spider is not None and crawler.spider.reached.is_set(), "p1")
        spider = crawler.spider
        outbox = crawler.engine._slot.scheduler.outbox
        await until(lambda: b.zcard(keys.leased) == 1, "the first page's lease replicated")
        b.replicaof("NO", "ONE")  # from here the replica gets nothing more
        b.delete(keys.dictionaries)  # it had not received the dictionary either
        stored = outbox.children_sent
        spider.go_on.set()
        await spider.yielded.wait()
        # 10 items and the next list page, stored (pending or leased) on the old primary
        await until(lambda: backqueues.count(a, keys) + a.zcard(keys.leased) >= 12, "the children")
        # and the worker has read the reply that confirms them (a reply still on its way
        # would be cut by the switch: the worker would then send them again, as new, to the
        # replica, and nothing would have been lost)
        await until(lambda: outbox.children_sent >= stored + 11, "the worker's confirmation")
        assert backqueues.count(b, keys) == 0, "the children reached the replica"
        forwarder.switch(replica.port)  # the failover: the worker now reaches the replica
        primary.kill()
        spider.finish.set()  # the first page ends: its ack goes to the replica
        await asyncio.wait_for(crawl, DEADLINE)
        restored = b.hget(keys.dictionaries, "1")
    finally:
        await tear_down(forwarder, (primary, replica), (a, b), crawl)
    ids = [item["id"] for item in crawler.spider.items]
    assert sorted(set(ids)) == list(range(1, 21)), "children lost at the failover"
    assert len(ids) - 20 <= 11 + IN_FLIGHT, f"{len(ids) - 20} duplicates"
    assert crawler.stats.get_value("ha/children_stored_again", 0) >= 11
    assert "lacked" in caplog.text
    # written back before the children: another reader, or a worker that joins later (which
    # would train another dictionary under the same id), reads what was compacted with it
    # (what the store and the fence said: a lease the replica lacked is said otherwise)
    sayers = ("scrapy_ha.store.dictionary", "scrapy_ha.scheduler.session.lost")
    said = [r.getMessage() for r in caplog.records if r.name in sayers]
    said = [m for m in said if "lacked" in m]
    if compacted:
        assert restored == data
        assert "compaction dictionar" in said[0] and "request(s)" in said[1]
    else:
        assert restored is None and not any("compaction dictionar" in m for m in said)


# -- the script's fence, on its own -------------------------------------------------------


def _child(n: int, parent: tuple[str, str]) -> NewEntry:
    return NewEntry(b"fp%d" % n, 0, b'{"url": "http://x/%d"}' % n, parent=parent)


@deferred_f_from_coro_f
async def test_a_server_without_the_children_it_confirmed_refuses_the_ack(tmp_path: Path):
    primary, replica = _servers(tmp_path)
    a, b = primary.client(), replica.client()
    keys = Keys("ha", "fence")
    old = RedisQueue(redis_lib.asyncio.Redis(port=primary.port), keys)
    new = RedisQueue(redis_lib.asyncio.Redis(port=replica.port), keys)
    try:
        await until(lambda: _replicating(a), "the replica")
        await old.sync(enqueue=[NewEntry(b"root", 0, b'{"url": "http://x/"}')], sender=("w1", 1))
        [page] = await old.lease(1, 60_000)
        await until(caught_up(a), "the replica to catch up")
        b.replicaof("NO", "ONE")
        parent = (page.id, page.token)
        children = [_child(n, parent) for n in (2, 3, 4)]
        stored = await old.sync(enqueue=children, sender=("w1", 2), expect=1)
        assert stored.added == 3
        # the promoted replica has the page's lease and the root (number 1), not 2..4
        with pytest.raises(ChildrenLost) as lost:
            await new.sync(ack=[parent], sender=("w1", 5), expect=4)
        assert lost.value.have == 1
        assert b.hexists(keys.leases, page.id), "the refused call wrote nothing"
        # stored again under their own numbers, the ack goes through, and nothing is lost
        again = await new.sync(enqueue=children, sender=("w1", 0), numbers=[2, 3, 4])
        assert again.added == 3
        done = await new.sync(ack=[parent], sender=("w1", 5), expect=4)
        assert (done.acked, done.pending) == (1, 3)
        # the same children sent once more are skipped by their numbers: none is doubled
        twice = await new.sync(enqueue=children, sender=("w1", 0), numbers=[2, 3, 4])
        assert twice.pending == 3
    finally:
        await old.client.aclose()
        await new.client.aclose()
        for server in (primary, replica):
            server.kill()
        a.close()
        b.close()
