"""The dead-letter alert's POST (:func:`post_json`), bounded as a whole by one deadline:
the connection (each address in turn), a proxy's tunnel, TLS, the request and the answer.
How it ended tells the alert whether the receiver may have the alert
(:class:`Unconfirmed`)."""

from __future__ import annotations

__all__ = ["ALERT_TIMEOUT", "Unanswered", "Unconfirmed", "post_json"]

import functools
import http.client
import io
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any, cast
from urllib.parse import unquote, urlsplit, urlunsplit

from w3lib.http import basic_auth_header

#: Seconds the whole POST has (name resolution, the connection, to each address in turn, a
#: proxy's tunnel, TLS, the request, the answer): a slow
#: receiver must not hold a thread for long, nor outlive the pending marker (``PENDING_TTL``
#: of :mod:`scrapy_ha.deadletters.alerts`).
ALERT_TIMEOUT = 10.0


class Unconfirmed(TimeoutError):
    """The answer began (the receiver had the request) but did not end within the POST's
    time: the receiver may have acted on it (it must not be sent again)."""


class Unanswered(OSError):
    """The connection to the receiver was made (and TLS) and the request went out on it,
    but no whole answer came: neither confirmed nor refused. The receiver may have read it
    (a slow one answers after the POST's time), or not (one that never reads: the request
    fit the kernel's buffers): it is not known."""


class _Deadline:
    """The time of one POST: its connection is made within it (each address resolved gets
    a share, so that one that never answers leaves time to the next), and its socket is
    shut when it ends, from its creation on (a proxy's tunnel, TLS, the request, a receiver
    that trickles its answer: each byte within a socket timeout holds no thread past it)."""

    def __init__(self, seconds: float, start: float | None = None) -> None:
        self.at = (time.monotonic() if start is None else start) + seconds
        #: the connection to the receiver was made (a proxy's tunnel and TLS too): from
        #: then on the request may reach it
        self.connected = False
        #: a byte of the answer came: the receiver has the request (it may have acted on it)
        self.answered = False
        self._timers: list[threading.Timer] = []
        self._watched: list[socket.socket] = []

    def left(self) -> float:
        return self.at - time.monotonic()

    def passed(self) -> bool:
        return self.left() <= 0

    def connect(
        self, address: tuple[str, int], timeout: Any = None, source: Any = None
    ) -> socket.socket:
        """A socket connected to *address* within the time left, then watched (as
        :func:`socket.create_connection`, whose place it takes: *timeout* is each later
        operation's): the address tried *i*-th of *n* has ``1/(n - i)`` of the time left,
        the last all of it."""
        found = self.resolve(*address)
        error: OSError = OSError(f"no address found for {address[0]}")
        for tried, (family, kind, proto, _, where) in enumerate(found):
            left = self.left()
            if left <= 0:
                raise TimeoutError("no time left to connect: nothing was sent") from error
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(left / (len(found) - tried))
                if source:
                    sock.bind(source)
                sock.connect(where)
            except OSError as exc:
                sock.close()
                error = exc
                continue
            sock.settimeout(timeout)
            self.watch(sock)
            return sock
        raise error

    def resolve(self, host: str, port: int) -> list[Any]:
        """The addresses of *host* (:func:`socket.getaddrinfo`) within the time left: looked
        up in a thread of its own, waited for no longer (a resolver that hangs holds the
        POST no longer; its thread ends with the lookup, or with the process)."""
        found: list[Any] = []
        failed: list[OSError] = []

        def lookup() -> None:
            try:
                found.extend(socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM))
            except OSError as exc:
                failed.append(exc)

        thread = threading.Thread(target=lookup, name="scrapy-ha alert resolver", daemon=True)
        thread.start()
        thread.join(max(self.left(), 0))
        if thread.is_alive():
            raise TimeoutError(f"{host} was not resolved in time: nothing was sent")
        if failed:
            raise failed[0]
        return found

    def watch(self, sock: socket.socket) -> None:
        """Shut *sock* when the time is up (a duplicate of it, shut in its place: TLS takes
        the socket object over, shutting the connection all the same)."""
        watched = sock.dup()
        self._watched.append(watched)
        timer = threading.Timer(max(self.left(), 0), _shut, (watched,))
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    def cancel(self) -> None:
        for timer in self._timers:
            timer.cancel()
        for sock in self._watched:
            sock.close()


def _shut(sock: socket.socket) -> None:
    """End the connection under the thread reading it (its read returns at once)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed meanwhile


class _Noticing(io.RawIOBase):
    """The bytes of an answer as they come, noting the first on the deadline."""

    def __init__(self, raw: Any, deadline: _Deadline) -> None:
        super().__init__()
        self.raw = raw
        self.deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        got: int | None = self.raw.readinto(buffer)
        if got:
            self.deadline.answered = True
        return got

    def close(self) -> None:
        if not self.closed:
            self.raw.close()
        super().close()


class _Answer(http.client.HTTPResponse):
    """The receiver's answer, its first byte noted (a proxy's answer to CONNECT is not)."""

    def __init__(self, sock: socket.socket, *args: Any, deadline: _Deadline, **kw: Any) -> None:
        super().__init__(sock, *args, **kw)
        self.fp = io.BufferedReader(_Noticing(self.fp.detach(), deadline))


class _TimedHTTP(http.client.HTTPConnection):
    """A connection under a :class:`_Deadline`: made and watched by it, its answer noted."""

    def __init__(self, *args: Any, deadline: _Deadline, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = deadline
        self._create_connection = deadline.connect

    def connect(self) -> None:
        super().connect()
        self.deadline.connected = True

    def getresponse(self) -> http.client.HTTPResponse:
        answer = functools.partial(_Answer, deadline=self.deadline)
        self.response_class = cast("type[http.client.HTTPResponse]", answer)
        return super().getresponse()


class _TimedHTTPS(_TimedHTTP, http.client.HTTPSConnection):
    """The same over TLS (the socket watched is the one TLS runs over)."""


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_TimedHTTP, deadline=self.deadline), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_TimedHTTPS, deadline=self.deadline), req)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer that refuses the alert (an :class:`urllib.error.HTTPError`
    of its status): urllib followed a 301, 302 or 303 as a GET without the alert's body,
    to any host, with the webhook's Basic credentials, and the alert counted as sent."""

    def redirect_request(
        self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> None:
        why = f"{msg} (a redirect, not followed: give HA_DLQ_ALERT_WEBHOOK the URL it leads to)"
        raise urllib.error.HTTPError(req.full_url, code, why, headers, fp)


def post_json(
    url: str, doc: dict[str, Any], timeout: float = ALERT_TIMEOUT, *, start: float | None = None
) -> int:
    """POST *doc* as JSON to *url* within *timeout* seconds in all, counted from *start* (a
    :func:`time.monotonic`; by default, now); return the HTTP status (blocking: run it in a
    thread, and pass the time the POST was decided: a thread that starts late has less).
    :class:`Unconfirmed` when a byte of the answer came but the time ended before the rest
    (it may have been delivered); :class:`Unanswered` when the request went out on a
    connection made but no whole answer came (it may have been read, or not); an
    :class:`urllib.error.HTTPError` when the receiver refused it (4xx, 5xx); another error
    when nothing was sent (no connection made). A
    ``user:password@`` in *url* is sent as Basic authentication (urllib would take it for
    a part of the host name); proxies are urllib's (``https_proxy``...). A redirect is not
    followed: an :class:`urllib.error.HTTPError` of its status (301, 302...)."""
    headers = {"Content-Type": "application/json", "User-Agent": "scrapy-ha"}
    parts = urlsplit(url)
    if "@" in parts.netloc:
        userinfo, host = parts.netloc.rsplit("@", 1)
        user, _, password = userinfo.partition(":")
        headers["Authorization"] = basic_auth_header(unquote(user), unquote(password)).decode()
        url = urlunsplit(parts._replace(netloc=host))
    request = urllib.request.Request(
        url, data=json.dumps(doc).encode(), headers=headers, method="POST"
    )
    deadline = _Deadline(timeout, start)
    handlers = (_HTTPHandler(deadline), _HTTPSHandler(deadline), _NoRedirect())
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(request, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError:
        raise  # an answer came: not delivered (4xx, 5xx)
    except (OSError, http.client.HTTPException) as exc:
        if deadline.passed() and deadline.answered:
            raise Unconfirmed(f"the answer begun did not end within {timeout:g} s") from exc
        if deadline.connected:  # (the time ran out: its own end of the connection, not a cause)
            why = "" if deadline.passed() else f": {exc}"
            raise Unanswered(f"no whole answer within {timeout:g} s{why}") from exc
        raise
    finally:
        deadline.cancel()
