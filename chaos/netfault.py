"""A fault-injecting TCP proxy for Redis: ``python chaos/netfault.py --to PORT``.

Prints ``LISTENING <port> <control port>``. A line sent to the control port changes what
happens to the traffic: ``stall SECONDS`` (hold every byte, both ways), ``drop`` (close every
connection), ``reset`` (abort every connection with a TCP RST), ``pass``.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import struct
import sys


class Faults:
    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.open = asyncio.Event()
        self.open.set()
        self.conns: set[asyncio.StreamWriter] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            writer.close()
            return
        self.conns |= {writer, up_w}
        await asyncio.gather(
            self.pipe(reader, up_w), self.pipe(up_r, writer), return_exceptions=True
        )
        self.conns -= {writer, up_w}

    async def pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                await self.open.wait()
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    def close_all(self, reset: bool) -> None:
        for writer in list(self.conns):
            sock = writer.get_extra_info("socket")
            if reset and sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort() if reset else writer.close()
        self.conns.clear()

    async def control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        command = (await reader.readline()).decode().split()
        if command[:1] == ["stall"]:
            self.open.clear()
            asyncio.get_running_loop().call_later(float(command[1]), self.open.set)
        elif command[:1] in (["drop"], ["reset"]):
            self.close_all(reset=command[0] == "reset")
        elif command[:1] == ["pass"]:
            self.open.set()
        writer.write(b"ok\n")
        await writer.drain()
        writer.close()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--to", type=int, required=True)
    args = parser.parse_args()
    faults = Faults(args.to)
    server = await asyncio.start_server(faults.handle, "127.0.0.1", 0)
    control = await asyncio.start_server(faults.control, "127.0.0.1", 0)
    ports = (server.sockets[0].getsockname()[1], control.sockets[0].getsockname()[1])
    sys.stdout.write(f"LISTENING {ports[0]} {ports[1]}\n")
    sys.stdout.flush()
    await asyncio.gather(server.serve_forever(), control.serve_forever())


if __name__ == "__main__":
    asyncio.run(main())
