"""The host of a request, as the worker and the scripts read it alike (its back queue's
and its domain's; lua/lib/stats.lua ``domain_of`` keeps the same rule)."""

from __future__ import annotations

import re

__all__ = ["payload_host", "url_host"]

#: A URL's scheme and authority, as the scripts read them from a payload (lua/lib/stats.lua
#: domain_of): the authority ends at a path, a query, a fragment, or a JSON quote or escape.
_AUTHORITY = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://([^/?#\"\\]*)")
#: The start of a stored request (the codec's document): its URL comes first.
_PAYLOAD_URL = re.compile(rb'^\{"v":[0-9]+,"u":"([^"]*)')
#: Lower case for ASCII letters only (as Lua's string.lower): a host's other characters
#: stay as they are.
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
#: Characters a host never holds; a URL whose authority has one has the host "-".
_NOT_IN_HOST = re.compile(r"[\s{}]")
#: The first part of a web URL split at its slashes: ``"http:"`` of ``http://host/path``.
_WEB = frozenset(("http:", "https:"))
#: Hosts of web URLs already read, by the part of the URL between its second and third
#: slash (its authority, and whatever follows it up to the path): reading a host costs
#: about 12,000 instructions, looking it up here about 3,000 (docs/benchmarks.md).
_HOSTS: dict[str, str] = {}
#: Most hosts remembered in ``_HOSTS`` (a few hundred KB); a crawl of more hosts than that
#: forgets them all and reads them again.
HOSTS_REMEMBERED = 4096
#: The longest authority remembered: a DNS name is at most 253 characters, and a port adds
#: six.
MAX_AUTHORITY = 260


def url_host(url: str) -> str:
    """The host of *url*: its back queue's and its domain's (lower case, without user
    info or port; an IPv6 literal keeps its brackets), or ``"-"`` when it has none."""
    parts = url.split("/", 3)
    if len(parts) > 2 and not parts[1] and parts[0] in _WEB:
        # http://<authority...>[/path]: the host is read from <authority...> alone, which
        # holds no slash (the authority ends at the first), whatever the web scheme
        segment = parts[2]
        host = _HOSTS.get(segment)
        if host is None:
            host = _read_host("http://" + segment)
            if _rememberable(segment):
                if len(_HOSTS) >= HOSTS_REMEMBERED:
                    _HOSTS.clear()
                _HOSTS[segment] = host
        return host
    return _read_host(url)


def _rememberable(segment: str) -> bool:
    """Whether the host of *segment* is remembered: an authority alone, without user info
    (a URL kept verbatim may have no path, so its query or fragment would follow: every
    such URL would be a key of its own, each as long as the URL)."""
    return len(segment) <= MAX_AUTHORITY and not any(c in segment for c in "?#@")


def _read_host(url: str) -> str:
    """:func:`url_host`, read with the regular expressions."""
    found = _AUTHORITY.match(url)
    if not found or _NOT_IN_HOST.search(found[1]):
        return "-"
    host = found[1].rpartition("@")[2]
    end = host.find("]") if host.startswith("[") else -1
    host = host[: end + 1] if end >= 0 else host.partition(":")[0]
    return host.translate(_ASCII_LOWER) if host else "-"


def payload_host(payload: bytes) -> str:
    """The host of a stored request's URL (:func:`url_host`), ``"-"`` for a payload that is
    not the codec's document."""
    found = _PAYLOAD_URL.match(payload)
    return url_host(found[1].decode("utf-8", "replace")) if found else "-"
