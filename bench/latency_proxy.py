"""A TCP delay line on loopback: ``python bench/latency_proxy.py --to PORT --delay-ms 1``
forwards to 127.0.0.1:PORT, delaying every chunk by --delay-ms in each direction (2 ms round
trip for 1), without limiting throughput. Prints ``LISTENING <port>``."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time


async def _delay_line(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float
) -> None:
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def pump() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        writer.close()

    task = asyncio.ensure_future(pump())
    try:
        while data := await reader.read(65536):
            queue.put_nowait((time.monotonic() + delay, data))
    except ConnectionError:
        pass
    queue.put_nowait((0.0, b""))
    await task


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--to", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=1.0)
    args = parser.parse_args()
    delay = args.delay_ms / 1000

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", args.to)
        await asyncio.gather(
            _delay_line(reader, up_w, delay),
            _delay_line(up_r, writer, delay),
            return_exceptions=True,
        )

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    sys.stdout.write(f"LISTENING {server.sockets[0].getsockname()[1]}\n")
    sys.stdout.flush()
    await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
