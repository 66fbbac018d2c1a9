"""``scrapy-ha metrics`` against a Redis that answers, but slowly: every reply a little under
``--timeout``. A QA run with each reply 2.5 s late (``--timeout 3``) saw every scrape take
12.6 s (22.6 s for the first), past Prometheus's default scrape timeout of 10 s: the exporter
was marked down (``ScrapyHAExporterDown``) and never said ``scrapy_ha_redis_up 0``."""

from __future__ import annotations

import socket
import threading
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest
import redis

from tests.test_metrics import exporter_factory, value  # noqa: F401 (a fixture)

if TYPE_CHECKING:
    from collections.abc import Iterator

#: Seconds each of Redis's replies is held back by the proxy: well under the exporter's
#: --timeout (TIMEOUT), so that no call alone times out; a scrape of a crawl makes four
#: (INFO memory, INFO stats, the SCAN that finds the crawls, the crawls' numbers).
LATENCY = 0.8
TIMEOUT = "2"


class SlowProxy:
    """A TCP proxy to Redis that holds each reply back by ``delay`` seconds (0: none)."""

    def __init__(self, redis_url: str) -> None:
        where = urlsplit(redis_url)
        self.target = where.port
        self.delay = 0.0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}{where.path}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._copy, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._copy, args=(server, client, True), daemon=True).start()

    def _copy(self, source: socket.socket, sink: socket.socket, slow: bool) -> None:
        try:
            while data := source.recv(65536):
                if slow and self.delay:
                    time.sleep(self.delay)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            sink.close()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def slow_proxy(redis_url: str) -> Iterator[SlowProxy]:
    proxy = SlowProxy(redis_url)
    yield proxy
    proxy.close()


def test_a_scrape_slower_than_the_timeout_as_a_whole_answers_redis_up_0(
    slow_proxy,
    exporter_factory,  # noqa: F811
):
    redis.Redis.from_url(slow_proxy.url).hset("ha:{books}:stats", "acked", 1)
    exporter = exporter_factory(slow_proxy.url, "--timeout", TIMEOUT, "--rescan", "0.1")
    assert value(exporter.scrape(), "scrapy_ha_acked_total", spider="books") == 1
    slow_proxy.delay = LATENCY  # each call well under --timeout, the scrape's several over it
    assert exporter.scrape() == {("scrapy_ha_redis_up", frozenset()): 0}
    slow_proxy.delay = 0
    assert value(exporter.scrape(), "scrapy_ha_acked_total", spider="books") == 1
