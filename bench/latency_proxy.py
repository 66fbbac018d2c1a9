"""A TCP delay line on loopback: ``python bench/latency_proxy.py --to PORT --delay-ms 1``
forwards to 127.0.0.1:PORT, delaying every chunk by --delay-ms in each direction (2 ms round
trip for 1), without limiting throughput. Prints ``LISTENING <port>``.

Each direction of a connection is a reader thread and a writer thread: the writer sleeps
until a chunk is due with ``time.sleep`` (nanosleep, exact to tens of microseconds). An
asyncio loop cannot keep such a delay: its epoll timeout is rounded up to whole
milliseconds, which made a nominal 2.4 ms round trip 4.3 ms (PING through the line).
"""

from __future__ import annotations

import argparse
import queue
import socket
import statistics
import sys
import threading
import time

#: What the writer thread is given to stop: the reader saw the end of its side.
_END = b""


def _reader(
    source: socket.socket, chunks: queue.SimpleQueue[tuple[float, bytes]], delay: float
) -> None:
    try:
        while data := source.recv(65536):
            chunks.put((time.monotonic() + delay, data))
    except OSError:
        pass
    chunks.put((0.0, _END))


def _writer(target: socket.socket, chunks: queue.SimpleQueue[tuple[float, bytes]]) -> None:
    try:
        while True:
            due, data = chunks.get()
            if data == _END:
                break
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            target.sendall(data)
    except OSError:
        pass
    try:
        target.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _direction(
    source: socket.socket, target: socket.socket, delay: float
) -> list[threading.Thread]:
    chunks: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()
    return [
        threading.Thread(target=_reader, args=(source, chunks, delay), daemon=True),
        threading.Thread(target=_writer, args=(target, chunks), daemon=True),
    ]


def _connection(client: socket.socket, upstream_port: int, delay: float) -> None:
    upstream = socket.create_connection(("127.0.0.1", upstream_port))
    for sock in (client, upstream):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threads = _direction(client, upstream, delay) + _direction(upstream, client, delay)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    client.close()
    upstream.close()


def measured_rtt(port: int, pings: int = 200) -> float:
    """The round trip through the line at *port* to a Redis behind it, in ms: the median of
    *pings* PINGs, one at a time, 2 ms apart (what the benchmarks report beside the nominal
    figure)."""
    return statistics.median(round_trips(port, pings))


def round_trips(port: int, pings: int = 200) -> list[float]:
    """Each of *pings* round trips through the line at *port* (ms), as
    :func:`measured_rtt` times them."""
    times = []
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(pings):
            started = time.perf_counter()
            sock.sendall(b"PING\r\n")
            reply = b""
            while not reply.endswith(b"\r\n"):
                reply += sock.recv(64)
            times.append((time.perf_counter() - started) * 1000)
            time.sleep(0.002)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--to", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=1.0)
    args = parser.parse_args()
    delay = args.delay_ms / 1000
    server = socket.create_server(("127.0.0.1", 0))
    sys.stdout.write(f"LISTENING {server.getsockname()[1]}\n")
    sys.stdout.flush()
    while True:
        client, _ = server.accept()
        threading.Thread(target=_connection, args=(client, args.to, delay), daemon=True).start()


if __name__ == "__main__":
    main()
