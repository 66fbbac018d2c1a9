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


@pytest.mark.parametrize("token", [" ", "\t\n"])
def test_a_token_of_blanks_is_refused(redis_url, token):
    # a QA run: a token of one space was taken, the dashboard reachable from other machines
    done = scrapy_ha("--redis-url", redis_url, "dashboard", "--host", "0.0.0.0", "--token", token)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: the dashboard's token (--token or HA_DASHBOARD_TOKEN)")


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


def test_an_address_of_the_host_this_machine_lacks_is_left_out(monkeypatch):
    """``localhost`` resolving to an IPv6 address the machine does not have (a container
    without IPv6 keeps ``::1 localhost`` in /etc/hosts): the dashboard listens on the
    addresses it has instead of refusing to start."""
    from scrapy_ha.cli.dashboard import _listening

    real = socket.getaddrinfo

    def resolved(host, port, *args, **kwargs):
        found = real("127.0.0.1", port, *args, **kwargs)
        absent = (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::2", port, 0, 0))
        return [absent, *found]  # ::2: no interface of this machine has it

    monkeypatch.setattr(socket, "getaddrinfo", resolved)
    socks = _listening("localhost", 0)
    try:
        assert [s.family for s in socks] == [socket.AF_INET]
        with socket.create_connection(socks[0].getsockname()[:2], timeout=START_TIMEOUT):
            pass
    finally:
        for sock in socks:
            sock.close()


def test_a_host_whose_every_address_is_absent_is_refused(monkeypatch):
    from scrapy_ha.cli.dashboard import _listening

    def resolved(host, port, *args, **kwargs):
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::2", port, 0, 0))]

    monkeypatch.setattr(socket, "getaddrinfo", resolved)
    with pytest.raises(OSError, match="assign requested address"):
        _listening("localhost", 0)
