"""Where ``scrapy-ha dashboard`` listens: as uvicorn binds (every address of the host, an
IPv6 one alone, without IPv4); an address it cannot bind (a port in use, a host that does
not resolve) is one sentence and exit code 2, never a traceback. The console script in a
subprocess."""

from __future__ import annotations

import re
import socket
import subprocess

import pytest

from scrapy_ha.demo import harness
from tests.test_cli import SCRAPY_HA, scrapy_ha
from tests.test_metrics import START_TIMEOUT, _first_line


def test_a_port_in_use_is_named_not_a_traceback(redis_url):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = scrapy_ha("--redis-url", redis_url, "dashboard", "--port", str(port))
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"error: cannot listen on 127.0.0.1:{port} (Address already in use)\n"


def test_a_host_that_does_not_resolve_is_named(redis_url):
    done = scrapy_ha(
        "--redis-url", redis_url, "dashboard", "--host", "no-such-host.invalid", "--token", "t"
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(
        "error: cannot listen on no-such-host.invalid:9411 (cannot resolve no-such-host.invalid: "
    ), done.stderr


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6 on this machine")
def test_the_ipv6_any_address_listens_on_ipv6_alone(redis_url):
    command = [SCRAPY_HA, "--redis-url", redis_url, "dashboard", "--host", "::", "--port", "0"]
    proc = harness.spawn([*command, "--token", "t"], stdout=subprocess.PIPE)
    try:
        line = _first_line(proc, START_TIMEOUT)
        found = re.search(r"http://\[::\]:(\d+)/$", line.strip())
        assert found, line
        port = int(found.group(1))
        with socket.create_connection(("::1", port), timeout=START_TIMEOUT):
            pass  # IPv6: listening
        with pytest.raises(ConnectionRefusedError), socket.socket() as ipv4:
            ipv4.connect(("127.0.0.1", port))  # IPV6_V6ONLY: not IPv4 too
    finally:
        harness.stop(proc)
