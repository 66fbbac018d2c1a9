"""Where ``scrapy-ha dashboard`` listens: an address it cannot bind (a port in use, a
host that does not resolve) is one sentence and exit code 2, never a traceback. The console
script in a subprocess."""

from __future__ import annotations

import socket

from tests.test_cli import scrapy_ha


def test_a_port_in_use_is_named_not_a_traceback(redis_url):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = scrapy_ha("--redis-url", redis_url, "dashboard", "--port", str(port))
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"error: cannot listen on 127.0.0.1:{port} (Address already in use)\n"
