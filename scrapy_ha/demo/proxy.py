"""A forward proxy on loopback with several exits, for the demo and tests.

``python -m scrapy_ha.demo.proxy --user u --password p --exits 3`` prints
``LISTENING <port>``. It serves plain HTTP requests (absolute URIs) and CONNECT
tunnels, requires Basic auth (407 otherwise), and sends each connection out
from one of its exits: the loopback addresses 127.0.0.2, 127.0.0.3, ... so the
target sees a different client address per exit, as with a real rotating
provider. The exit is chosen by the session in the user name
(``u-session-<token>``: the same token, the same exit) or, without a session,
anew for each connection (a kept-alive tunnel keeps its exit). An HTTP request
with the header ``X-Rotate-Exit: 1`` takes the next exit. ``--status 502`` answers every
request (and CONNECT) with that status itself, as a proxy whose own upstream is broken.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import os
import signal
import sys


class Proxy:
    def __init__(
        self, user: str, password: str, exits: int, first_exit: int = 2, status: int = 0
    ) -> None:
        self.user, self.password = user, password
        self.status = status  # answer everything with it (0: forward)
        self.exits = [f"127.0.0.{i}" for i in range(first_exit, first_exit + exits)]
        self._next = itertools.cycle(range(exits))
        self._sessions: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None] | None] = set()

    def exit_for(self, session: str | None, rotate: bool = False) -> str:
        if session is None or rotate:
            return self.exits[next(self._next)]
        if session not in self._sessions:
            self._sessions[session] = next(self._next)
        return self.exits[self._sessions[session]]

    def check_auth(self, headers: dict[str, str]) -> tuple[bool, str | None]:
        """(authorized, session token)."""
        if not self.user:
            return True, None  # no auth: an IP-whitelisted pool proxy
        value = headers.get("proxy-authorization", "")
        if not value.lower().startswith("basic "):
            return False, None
        try:
            user, _, password = base64.b64decode(value[6:]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False, None
        name, _, session = user.partition("-session-")
        return (name == self.user and password == self.password), (session or None)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)  # asyncio keeps only a weak reference to connection handlers
        try:
            await self._handle(reader, writer)
        finally:
            self._tasks.discard(task)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ", 2)
        headers = {
            k.strip().lower(): v.strip()
            for k, _, v in (line.partition(":") for line in lines[1:] if line)
        }
        ok, session = self.check_auth(headers)
        if not ok:
            writer.write(
                b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                b'Proxy-Authenticate: Basic realm="demo"\r\nContent-Length: 0\r\n'
                b"Connection: close\r\n\r\n"
            )
            await _close(writer)
            return
        if self.status:
            writer.write(b"HTTP/1.1 %d Proxy Error\r\nContent-Length: 0\r\n\r\n" % self.status)
            await _close(writer)
            return
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            await self.tunnel(reader, writer, host, int(port), self.exit_for(session))
        else:
            rotate = headers.get("x-rotate-exit") == "1"
            await self.forward(
                reader, writer, method, target, version, lines[1:], self.exit_for(session, rotate)
            )

    async def tunnel(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        host: str,
        port: int,
        exit_ip: str,
    ) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(host, port, local_addr=(exit_ip, 0))
        except OSError:
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            await _close(writer)
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await asyncio.gather(_pipe(reader, up_w), _pipe(up_r, writer))

    async def forward(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        method: str,
        target: str,
        version: str,
        header_lines: list[str],
        exit_ip: str,
    ) -> None:
        rest = target.split("://", 1)[1]
        hostport, _, path = rest.partition("/")
        host, _, port = hostport.partition(":")
        try:
            up_r, up_w = await asyncio.open_connection(
                host, int(port or 80), local_addr=(exit_ip, 0)
            )
        except OSError:
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            await _close(writer)
            return
        kept = [
            h
            for h in header_lines
            if h
            and not h.lower().startswith(("proxy-", "connection", "x-rotate-exit", "keep-alive"))
        ]
        head = f"{method} /{path} {version}\r\n" + "".join(f"{h}\r\n" for h in kept)
        up_w.write((head + "Connection: close\r\n\r\n").encode("latin-1"))
        length = int(
            next((h.split(":", 1)[1] for h in kept if h.lower().startswith("content-length")), "0")
        )
        if length:
            up_w.write(await reader.readexactly(length))
        response = await up_r.read()
        up_w.close()
        status_line, _, rest_of = response.partition(b"\r\n")
        writer.write(status_line + b"\r\nX-Proxy-Exit: " + exit_ip.encode() + b"\r\n" + rest_of)
        await _close(writer)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def _close(writer: asyncio.StreamWriter) -> None:
    try:
        await writer.drain()
    except ConnectionError:
        pass
    writer.close()


async def serve(args: argparse.Namespace) -> None:
    user = "" if args.no_auth else args.user
    proxy = Proxy(user, args.password, args.exits, args.first_exit, args.status)
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", args.port)
    sys.stdout.write(f"LISTENING {server.sockets[0].getsockname()[1]}\n")
    sys.stdout.flush()
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # stop at once, open tunnels and all
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--user", default="demo")
    parser.add_argument("--password", default="demo-secret")
    parser.add_argument("--exits", type=int, default=3)
    parser.add_argument("--first-exit", type=int, default=2, help="exits are 127.0.0.N from N")
    parser.add_argument("--no-auth", action="store_true", help="accept every client")
    parser.add_argument("--status", type=int, default=0, help="answer every request with it")
    asyncio.run(serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
