"""A dead letter of the ``network`` class says why the download failed: the exception's
message, not its type alone. Real downloads through Scrapy against a real Redis: a port that
refuses, a name that does not resolve, a server that accepts and never answers, TLS spoken
to a plain HTTP port, and Playwright's own ``Error`` (raised by a downloader middleware where
scrapy-playwright's handler would, with the message it gives) listed in RETRY_EXCEPTIONS as
the reference says. Before, each reason was the class name: ``scrapy.exceptions.
DownloadFailedError`` for a TLS error and a reset alike, ``playwright._impl._errors.Error``
without its ``net::ERR_NAME_NOT_RESOLVED``."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import TYPE_CHECKING, Any

import pytest
import scrapy
from playwright._impl._errors import Error as PlaywrightError
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.dlq import DeadLetterQueue
from scrapy_ha.middlewares.reasons import MESSAGE_LIMIT
from tests.test_quiet_log import closed_port

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")

SETTINGS = {
    "ADDONS": {"scrapy_ha.Addon": 0},
    "HA_IDLE_TIMEOUT": 0.5,
    "HA_RETRY_TIMES": 0,
    "DOWNLOAD_TIMEOUT": 1,
    "LOG_LEVEL": "INFO",
    "DOWNLOADER_MIDDLEWARES": {f"{__name__}.BrowserStandIn": 950},
    "RETRY_EXCEPTIONS": [
        *scrapy.settings.default_settings.RETRY_EXCEPTIONS,
        "playwright._impl._errors.Error",
    ],
}
#: What Chromium says of a name that does not resolve (scrapy-playwright raises it as is).
NOT_RESOLVED = "net::ERR_NAME_NOT_RESOLVED at http://nohost.invalid/"


class BrowserStandIn:
    """Fails a request marked ``browser_error`` as scrapy-playwright's download handler
    does when Chromium cannot load the page: Playwright's ``Error`` with Chromium's words."""

    def process_request(self, request: scrapy.Request, spider: Any = None) -> None:
        message = request.meta.get("browser_error")
        if message:
            raise PlaywrightError(message)


class UrlsSpider(scrapy.Spider):
    name = "reasons"

    def __init__(self, requests: tuple[tuple[str, dict[str, Any]], ...] = (), **kwargs: Any):
        super().__init__(**kwargs)
        self.to_fetch = requests

    async def start(self) -> Any:
        for url, meta in self.to_fetch:
            yield scrapy.Request(url, meta=meta, dont_filter=True)

    def parse(self, response: Any) -> Any:
        return []


@contextlib.contextmanager
def plain_http() -> Iterator[str]:
    """A port that answers whatever comes with a plain HTTP 400 and closes, as
    ``python -m http.server`` answers a TLS handshake: its URL as ``https://``."""
    server = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                with conn:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{server.getsockname()[1]}/tls"
    finally:
        server.close()


async def reasons(redis_url: str) -> dict[str, str]:
    async with DeadLetterQueue.from_url(redis_url, "reasons", prefix="ha") as dlq:
        return {entry.url: entry.reason for entry in await dlq.entries(limit=100)}


@deferred_f_from_coro_f
async def test_a_network_dead_letter_keeps_the_message_of_its_error(redis_url):
    refused = f"http://127.0.0.1:{closed_port()}/refused"
    long_error = "net::ERR_FAILED at http://127.0.0.1:9/?api_key=s3cr3t&x=" + "y" * 5000
    with plain_http() as plain, socket.socket() as silent:  # (silent: accepts, never answers)
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        hung = f"http://127.0.0.1:{silent.getsockname()[1]}/hang?token=hunter2"
        requests = (
            (refused, {}),
            ("http://nohost.invalid/", {}),
            (hung, {}),
            (hung + "&page=2", {}),
            (plain, {}),
            ("http://127.0.0.1:9/browser", {"browser_error": NOT_RESOLVED}),
            ("http://127.0.0.1:9/long", {"browser_error": long_error}),
        )
        crawler = get_crawler(UrlsSpider, {**SETTINGS, "REDIS_URL": redis_url})
        await crawler.crawl_async(requests=requests)
    got = await reasons(redis_url)  # (by the URL as stored: the reasons are masked)
    assert crawler.stats.get_value("ha/dead/network") == len(requests), got
    assert got[refused] == (
        "scrapy.exceptions.DownloadConnectionRefusedError: "
        "Connection was refused by other side: 111: Connection refused."
    )
    assert got["http://nohost.invalid/"].startswith(
        "scrapy.exceptions.CannotResolveHostError: DNS lookup failed: "
    ), got
    assert "nohost.invalid" in got["http://nohost.invalid/"]
    # the request's own URL: "<url>" (its secrets masked all the same, as any URL's)
    assert got[hung] == (
        "scrapy.exceptions.DownloadTimeoutError: Getting <url> took longer than 1.0 seconds."
    )
    assert got[hung + "&page=2"] == got[hung]  # one reason for `scrapy-ha report` to count
    # what Twisted wrapped, not "[<twisted.python.failure.Failure OpenSSL.SSL.Error: ...>]"
    assert got[plain].startswith("scrapy.exceptions.DownloadFailedError: OpenSSL.SSL.Error: ")
    assert "twisted.python.failure" not in got[plain]
    # (another URL than the request's own stays: here the page Chromium tried to load)
    assert got["http://127.0.0.1:9/browser"] == f"playwright._impl._errors.Error: {NOT_RESOLVED}"
    cut = got["http://127.0.0.1:9/long"]  # bounded, one line, the secret masked before the cut
    assert cut.startswith("playwright._impl._errors.Error: net::ERR_FAILED at ")
    assert len(cut) == len("playwright._impl._errors.Error: ") + MESSAGE_LIMIT
    assert cut.endswith("…") and "s3cr3t" not in cut and "api_key=***" in cut
