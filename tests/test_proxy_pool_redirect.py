"""A proxy list API that redirects: the list is fetched where it leads, and the API's
credentials (the ``user:password@`` of ``HA_PROXY_POOL_URL``, sent as Basic auth) go only
to the API's own origin (scheme, host and port). urllib sent them on to whatever host a
redirect named."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler
from w3lib.http import basic_auth_header

from tests.spiders import FaultSpider
from tests.test_proxy import settings

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

PASSWORD = "pool-api-pw-6e0b"
CREDENTIALS = basic_auth_header("api-user", PASSWORD).decode()


class Api:
    """An HTTP server on loopback *host*: each request recorded (method, path,
    Authorization; its body read), answered by *answer* (path, Authorization) -> (status,
    headers, body)."""

    def __init__(self, host: str, answer: Callable[[str, str | None], Any]) -> None:
        self.requests: list[tuple[str, str, str | None]] = []
        requests = self.requests

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                auth = self.headers.get("Authorization")
                requests.append((self.command, self.path, auth))
                status, headers, body = answer(self.path, auth)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer  # noqa: N815 (http.server's names)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def gets(self) -> list[tuple[str, str | None]]:
        return [(path, auth) for method, path, auth in self.requests if method == "GET"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def apis() -> Iterator[list[Api]]:
    started: list[Api] = []
    yield started
    for api in started:
        api.close()


@pytest.mark.parametrize("where", ["another host", "the same origin"])
@deferred_f_from_coro_f
async def test_a_redirect_takes_the_api_s_credentials_to_its_own_origin_alone(
    redis_url, site, proxy_factory, apis, where
):
    proxy = proxy_factory("--no-auth", "--exits", "1", "--first-exit", "3")
    listing = json.dumps([f"127.0.0.1:{proxy.port}"]).encode()

    def list_it(path: str, auth: str | None) -> Any:
        if path == "/proxies":  # the API itself: it asks for its credentials
            if auth != CREDENTIALS:
                return 401, {}, b"credentials, please"
            return 302, {"Location": f"{target.url}/list"}, b""
        return 200, {"Content-Type": "application/json"}, listing

    api = Api("127.0.0.1", list_it)
    apis.append(api)
    target = api if where == "the same origin" else Api("127.0.0.2", list_it)
    apis.append(target)
    url = api.url.replace("://", f"://api-user:{PASSWORD}@") + "/proxies"
    paths = ("/item/1", "/item/2")
    crawler = get_crawler(
        FaultSpider, settings(redis_url, HA_PROXY_MODE="pool", HA_PROXY_POOL_URL=url)
    )
    await crawler.crawl_async(base_url=site.url, paths=paths)
    assert sorted(crawler.spider.ok) == sorted(paths)  # through the listed proxy
    assert crawler.stats.get_value(f"ha/proxy/127.0.0.1:{proxy.port}/requests") == len(paths)
    listed = [auth for path, auth in target.gets if path == "/list"]
    assert listed, target.gets
    expected = CREDENTIALS if where == "the same origin" else None
    assert set(listed) == {expected}, f"the list's GET at {where} had {listed}"
