"""The dead-letter alert's POST against receivers that fail in the network: an address that
never answers, a proxy that trickles its tunnel, a receiver that never reads or answers
late. Real sockets;
name resolution and the POST's 10 s are shortened where the test says so."""

from __future__ import annotations

import asyncio
import functools
import http.client
import json
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
import redis.asyncio
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.deadletters import alerts
from scrapy_ha.deadletters.alerts import DeadLetterAlert, Unanswered, Unconfirmed, post_json
from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from tests.spiders import FaultSpider
from tests.test_alerts import Receiver, dead_letters_one_by_one

if TYPE_CHECKING:
    from collections.abc import Iterator

#: Seconds the POST has in these tests (ALERT_TIMEOUT's 10 s, shortened)
TIMEOUT = 3.0
#: Seconds a pending marker lives in these tests (PENDING_TTL's 60 s, shortened)
PENDING = TIMEOUT + 2


class Listener:
    """A TCP listener; *serve* runs on each connection accepted, in a thread of its own."""

    def __init__(self, serve: Any = None, backlog: int = 16) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=backlog)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self.done = threading.Event()
        if serve is not None:
            threading.Thread(target=self._accept, args=(serve,), daemon=True).start()

    def _accept(self, serve: Any) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            self.accepted.append(conn)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    def close(self) -> None:
        for conn in self.accepted:
            conn.close()
        self.sock.close()


@pytest.fixture
def listeners() -> Iterator[list[Listener]]:
    made: list[Listener] = []
    yield made
    for listener in made:
        listener.close()


def black_hole() -> Listener:
    """A listener whose accept queue is full (nobody accepts): a connection to it gets no
    answer at all (the kernel drops its SYN), as a host that black-holes the port."""
    hole = Listener(backlog=0)
    filler = socket.create_connection(("127.0.0.1", hole.port), timeout=TIMEOUT)
    hole.accepted.append(filler)  # the queue's one place, taken
    return hole


def resolve_to(monkeypatch, host: str, *ports: int) -> None:
    """*host* resolves to 127.0.0.1 at each of *ports*, in that order."""
    real = socket.getaddrinfo

    def getaddrinfo(name: Any, *args: Any, **kwargs: Any) -> Any:
        if name != host:
            return real(name, *args, **kwargs)
        tcp = (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "")
        return [(*tcp, ("127.0.0.1", port)) for port in ports]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def test_an_address_that_never_answers_leaves_time_to_the_next(monkeypatch, listeners):
    """Before: the first address (black-holed) took the whole time, the second connected,
    and the POST was refused unsent ("connected too late"): every alert, every time."""
    hole = black_hole()
    listeners.append(hole)
    receiver = Receiver()
    try:
        resolve_to(monkeypatch, "hook.test", hole.port, receiver.server.server_address[1])
        status = post_json("http://hook.test/hook/token", {"text": "hi"}, timeout=TIMEOUT)
        assert status == 200 and receiver.posts == [{"text": "hi"}]
    finally:
        receiver.close()


def trickle_connect_answer(written: list[int], conn: socket.socket) -> None:
    """A proxy that reads a CONNECT and answers it a byte at a time, each well within a
    socket timeout, counting the bytes it could write."""
    conn.recv(65536)
    for byte in b"HTTP/1.1 200 Connection established\r\nProxy-Agent: slow\r\n\r\n":
        try:
            conn.sendall(bytes([byte]))
        except OSError:
            return  # the client gave up
        written.append(byte)
        threading.Event().wait(TIMEOUT / 6)
    conn.close()


def test_the_post_s_time_holds_through_a_proxy_s_tunnel(monkeypatch, listeners):
    """Before: the deadline watched the socket after the tunnel was made, so a proxy that
    trickled its answer to CONNECT held the POST for as long as it pleased (here the whole
    answer, 10 s); now the POST ends at its time, the proxy's answer cut."""
    written: list[int] = []
    proxy = Listener(functools.partial(trickle_connect_answer, written))
    listeners.append(proxy)
    monkeypatch.setenv("https_proxy", f"http://127.0.0.1:{proxy.port}")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    with pytest.raises((OSError, http.client.HTTPException)) as raised:
        post_json("https://hook.test/hook/token", {"text": "hi"}, timeout=TIMEOUT)
    assert not isinstance(raised.value, Unconfirmed)  # a proxy's bytes are no answer
    assert 0 < len(written) < 40  # its answer was cut (all of it: 58 bytes)


def deaf(conn: socket.socket) -> None:
    """A receiver that takes the connection and never reads from it."""


class Late:
    """A receiver that reads each request whole and records it, then answers only once the
    client gave up (its POST's time ended): an answer after the deadline."""

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []

    def __call__(self, conn: socket.socket) -> None:
        with conn.makefile("rb") as request:
            length = 0
            while (line := request.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            self.posts.append(json.loads(request.read(length)))
        while conn.recv(1024):  # until the client hangs up
            pass
        try:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        except OSError:
            pass  # too late: nobody reads it


async def wait_expired(q: RedisQueue) -> None:
    """Until the alert's pending marker expired (PENDING after its check)."""
    while await q.client.exists(q.keys.dlq_alert):
        await asyncio.sleep(0.1)


@pytest.fixture
def short_alert(monkeypatch) -> None:
    """The POST's 10 s and the pending marker's 60 s shortened."""
    monkeypatch.setattr(alerts, "post_json", functools.partial(post_json, timeout=TIMEOUT))
    monkeypatch.setattr(alerts, "PENDING_TTL", PENDING)


@deferred_f_from_coro_f
async def test_a_receiver_that_answers_late_gets_the_alert_once_per_pending_marker(
    redis_url, listeners, short_alert
):
    """Before: a POST sent whole with no answer byte was a failure and took its marker
    back: a receiver that reads the alert and answers after the POST's 10 s got it again at
    every dead letter (one duplicate every 10 s during a ban). Now its pending marker is
    left to expire: the dead letters meanwhile send nothing, the first after it sends again."""
    late = Late()
    receiver = Listener(late)
    listeners.append(receiver)
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), Keys("ha", "alerted"))
    stats = MemoryStatsCollector(get_crawler(FaultSpider))
    alert = DeadLetterAlert(f"http://127.0.0.1:{receiver.port}/hook/token", 1, stats, "w1")
    try:
        await dead_letters_one_by_one(alert, q, 3)
        assert [post["dead"] for post in late.posts] == [1]  # dead letters 2 and 3: no POST
        assert stats.get_value("ha/alert/unanswered") == 1
        assert stats.get_value("ha/alert/errors") is None
        assert json.loads(await q.client.get(q.keys.dlq_alert))["state"] == "pending"
        await wait_expired(q)
        await dead_letters_one_by_one(alert, q, 1, first=4)
        assert [post["dead"] for post in late.posts] == [1, 4]
        assert stats.get_value("ha/alert/unanswered") == 2
    finally:
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_receiver_that_never_reads_gets_the_alert_again(redis_url, listeners, short_alert):
    """Before: the request fit the kernel's buffers, "sent whole", and the alert was
    recorded as sent (unconfirmed) though the receiver never read it: never sent again.
    No byte of an answer is no confirmation: once its pending marker expired, the next dead
    letter sends it again (not at every dead letter: the receiver may be a slow one)."""
    receiver = Listener(deaf)
    listeners.append(receiver)
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), Keys("ha", "alerted"))
    stats = MemoryStatsCollector(get_crawler(FaultSpider))
    alert = DeadLetterAlert(f"http://127.0.0.1:{receiver.port}/hook/token", 1, stats, "w1")
    try:
        await dead_letters_one_by_one(alert, q, 2)
        assert len(receiver.accepted) == 1
        await wait_expired(q)
        await dead_letters_one_by_one(alert, q, 1, first=3)
        assert len(receiver.accepted) == 2  # sent again
        assert stats.get_value("ha/alert/unconfirmed") is None
        assert stats.get_value("ha/alert/errors") is None
        assert stats.get_value("ha/alert/unanswered") == 2
    finally:
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_resolver_that_hangs_ends_the_post_at_its_time(redis_url, monkeypatch, short_alert):
    """Before: the POST's time did not bound name resolution: a resolver that hung held the
    POST's thread past close()'s wait (ALERT_TIMEOUT + 1), the alert still under way. Now
    the lookup has the POST's time: the POST fails, nothing sent, its marker taken back."""
    release = threading.Event()
    real = socket.getaddrinfo

    def hanging(name: Any, *args: Any, **kwargs: Any) -> Any:
        if name != "hook.test":
            return real(name, *args, **kwargs)
        release.wait()
        return []

    monkeypatch.setattr(socket, "getaddrinfo", hanging)
    monkeypatch.setattr(alerts, "ALERT_TIMEOUT", TIMEOUT)  # close() waits a second more
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), Keys("ha", "alerted"))
    stats = MemoryStatsCollector(get_crawler(FaultSpider))
    alert = DeadLetterAlert("http://hook.test/hook/token", 1, stats, "w1")
    try:
        await dead_letters_one_by_one(alert, q, 1)  # close() returned
        assert stats.get_value("ha/alert/errors") == 1  # the POST ended, a failure
        assert await q.client.get(q.keys.dlq_alert) is None  # nothing sent: taken back
    finally:
        release.set()
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_the_post_s_time_starts_at_the_check_not_in_its_thread(redis_url, short_alert):
    """Before: the POST's time started when its thread did, the pending marker's at the
    check: behind a busy executor the POST began late with its whole time, and could end
    after its marker (another worker's POST then under way too). Now a POST whose thread
    starts once its time, counted from the check, is spent sends nothing."""
    loop = asyncio.get_running_loop()
    gate = threading.Event()
    # more tasks than the default executor has threads (32 at most): the POST waits behind
    busy = [loop.run_in_executor(None, gate.wait) for _ in range(64)]
    receiver = Receiver()
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), Keys("ha", "alerted"))
    stats = MemoryStatsCollector(get_crawler(FaultSpider))
    alert = DeadLetterAlert(receiver.url, 1, stats, "w1")
    try:
        await q.client.zadd(q.keys.dead, {"1": 1})
        checked = time.monotonic()
        await alert.check(q)
        while time.monotonic() < checked + TIMEOUT:  # the POST's time, from the check
            await asyncio.sleep(0.1)
        assert stats.get_value("ha/alert/errors") is None  # the POST has not begun
        gate.set()
        await asyncio.gather(*busy)
        await alert.close()
        assert receiver.posts == []  # nothing sent, too late
        assert stats.get_value("ha/alert/errors") == 1
        assert await q.client.get(q.keys.dlq_alert) is None  # taken back at once
    finally:
        gate.set()
        receiver.close()
        await q.client.aclose()


def test_the_answer_s_first_byte_makes_it_unconfirmed(monkeypatch, listeners):
    """A receiver that read the request and began its answer may have acted on it."""

    def half_answer(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.")  # then nothing: the answer cut

    receiver = Listener(half_answer)
    listeners.append(receiver)
    with pytest.raises(Unconfirmed):
        post_json(f"http://127.0.0.1:{receiver.port}/hook", {"text": "hi"}, timeout=TIMEOUT)


def test_a_post_whose_time_ran_out_does_not_say_the_receiver_closed_it(listeners):
    """Before: the POST's own deadline ends the connection under its read, and the WARNING
    said why in http.client's words: "no whole answer within 10 s: Remote end closed
    connection without response", of a receiver that held the connection open all along
    (a QA run's stalled receiver): the operator looked for a receiver that hangs up."""
    late = Late()
    receiver = Listener(late)
    listeners.append(receiver)
    with pytest.raises(Unanswered) as raised:
        post_json(f"http://127.0.0.1:{receiver.port}/hook/token", {"text": "x"}, timeout=TIMEOUT)
    assert late.posts == [{"text": "x"}]
    assert str(raised.value) == f"no whole answer within {TIMEOUT:g} s"
