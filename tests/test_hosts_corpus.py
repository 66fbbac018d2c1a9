"""A web request's host looked up by the part of its URL that holds its authority
(scrapy_ha/store/hosts.py): the same host as the regular expressions read, for every URL
form, compared on a corpus of odd URLs and on random ones, read first and looked up again."""

from __future__ import annotations

import random
import re

import pytest

from scrapy_ha.store import hosts
from scrapy_ha.store.hosts import url_host

# -- the rule as it was read before, with the two regular expressions alone (the reference)
_AUTHORITY = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://([^/?#\"\\]*)")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_NOT_IN_HOST = re.compile(r"[\s{}]")


def reference_host(url: str) -> str:
    found = _AUTHORITY.match(url)
    if not found or _NOT_IN_HOST.search(found[1]):
        return "-"
    host = found[1].rpartition("@")[2]
    end = host.find("]") if host.startswith("[") else -1
    host = host[: end + 1] if end >= 0 else host.partition(":")[0]
    return host.translate(_ASCII_LOWER) if host else "-"


ODD = [
    "http://127.0.0.1:8000/item/1",
    "http://Books.Example:8080/a",
    "HTTP://WWW.EXAMPLE.COM",
    "https://user:pw@shop.example/x?y=1",
    "https://user@Shop.Example:443",
    "http://a@b@c.example/",
    "http://user:p%40ss@host.test/",
    "http://[::1]:6800/x",
    "http://[2001:DB8::1]/",
    "http://[::1/",
    "http://[]/",
    "http://user@[fe80::1%25eth0]:80/",
    "http://10.0.0.1/",
    "http://10.0.0.1",
    "https://xn--bcher-kva.example/",
    "https://bücher.example/",
    "https://BÜCHER.Example/",
    "http://ΑΘΗΝΑ.gr/",
    "http://host_with_underscore.test/",
    "http:///no-host",
    "http://",
    "http://:80/",
    "http://@/",
    "http://user@/",
    "mailto:nobody@example.com",
    "about:blank",
    "data:text/plain,hi",
    "file:///etc/passwd",
    "http://a b/",
    "http://a\tb/",
    "http://a\u00a0b/",
    "http://a\u2028b/",
    "http://a\x1cb/",
    "http://brace}.example/",
    "http://{brace.example/",
    'http://quote".example/',
    "http://back\\slash.example/",
    "http://host.example?q=1",
    "http://host.example#frag",
    "http://host.example:8080?q=/x",
    "http://host.example\\path",
    "svn+ssh://Host.Example/repo",
    "git-upload.pack://Host/x",
    "a.b://h/",
    "1http://host/",
    "+http://host/",
    "ht tp://host/",
    "héttp://host/",
    "http:/host/",
    "http:host",
    "://host/",
    "x://host/",
    "X://HOST/",
    "http:://host/",
    "http://host://other/",
    "chrome-extension://ABC/x",
    "http://host.example.:80/",
    "http://~user!$&'()*+,;=@host/",
    "http://HOST.EXAMPLE:port/",
    "http://host:80:90/",
    "http://h/" + "a" * 500,
    "",
    "h",
    "http://\ud800.example/",
    "https://h.example?x=/y",
    "https://h.example#a/b",
    "http://user/name@h.example/",
    "https://[::1]",
    "http://[::1]x:80/",
    "http:/",
    "http:/a/b/c",
    "https:/x/host.example/",
    "http:",
    "https//host/",
    "http:\\\\host\\",
    "http://a%20b.example/",
    "http://A.B.C.D.E.example:65536/",
]

#: What random URLs are made of: the characters that matter to the rule, and others.
ALPHABET = list('aZ09.-_~:@[]%/?#"\\{} \t+!;=éΑ\u00a0\x1c') + ["://", "http", "HTTP"]


def random_urls(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    urls = []
    for _ in range(n):
        scheme = rng.choice(["http", "https", "HTTP", "svn+ssh", "a1", "1a", "", "é", "x-y"])
        body = "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(0, 16)))
        urls.append(f"{scheme}://{body}" if rng.random() < 0.8 else scheme + body)
    return urls


@pytest.mark.parametrize("url", ODD)
def test_an_odd_url_has_the_host_the_regular_expressions_read(url):
    hosts._HOSTS.clear()
    assert url_host(url) == reference_host(url)  # read
    assert url_host(url) == reference_host(url)  # looked up


def test_random_urls_have_the_host_the_regular_expressions_read_then_looked_up():
    hosts._HOSTS.clear()
    urls = random_urls(20_000, seed=34) + ODD
    for url in urls + random.Random(35).sample(urls, len(urls)):
        assert url_host(url) == reference_host(url), repr(url)
    assert hosts._HOSTS  # the web URLs' hosts were looked up


def test_the_hosts_remembered_are_bounded(monkeypatch):
    monkeypatch.setattr(hosts, "HOSTS_REMEMBERED", 8)
    hosts._HOSTS.clear()
    for n in range(100):
        assert url_host(f"https://U{n}@Host{n}.Example:{n}/x") == f"host{n}.example"
        assert len(hosts._HOSTS) <= 8


def test_a_url_with_no_path_or_with_user_info_is_read_not_remembered():
    """An authority alone is a key: a URL kept verbatim may have no path, and its query
    would make every URL a key of its own, as long as the URL (a cache of URLs, not of
    hosts); user info stays out of the process's memory too."""
    hosts._HOSTS.clear()
    for n in range(50):
        assert url_host(f"http://Shop.example?id={n}&pad=" + "x" * 1000) == "shop.example"
        assert url_host(f"https://shop.example#part{n}") == "shop.example"
        assert url_host(f"https://alice:s3cret{n}@shop.example/") == "shop.example"
        assert url_host(f"http://{'a' * 300}{n}.example/") == f"{'a' * 300}{n}.example"
    assert hosts._HOSTS == {}
    assert url_host("http://shop.example/a?b") == "shop.example"
    assert hosts._HOSTS == {"shop.example": "shop.example"}
