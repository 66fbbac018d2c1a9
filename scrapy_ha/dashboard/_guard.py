"""Who may read and act: the token, the CSRF token of forms, the Host of a local dashboard.

- With a token (``--token`` / ``HA_DASHBOARD_TOKEN``), every request but the login form
  carries it: header ``Authorization: Bearer <token>`` or ``X-HA-Token``, or the cookie the
  login form sets (a value derived from the token, never the token itself).
- Without one, the dashboard answers only requests addressed to a loopback name, so a web
  page elsewhere cannot reach it by pointing its own host name at 127.0.0.1.
- Every POST must come from the dashboard's own origin (:func:`foreign_post`): a browser
  says where a request comes from, and a page of another origin, or of another port of the
  same host, is refused (403) before anything runs.
- A form's POST carries the CSRF token of its browser: an HMAC, under a secret of this
  server process, of the random value of the browser's CSRF cookie. A page of another port
  of the same host can set that cookie (cookies do not tell ports apart) but cannot compute
  the token. A POST to ``/api/`` must be ``application/json``, which a page of another
  origin cannot send without a preflight this server never grants.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from collections.abc import Mapping

#: Host names a dashboard without a token answers (its bind address is loopback).
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
#: Cookie that holds the login (derived from the token).
SESSION_COOKIE = "ha_dashboard_session"
#: Cookie that holds this browser's CSRF session: a random value the form token is derived from.
CSRF_COOKIE = "ha_dashboard_csrf"
#: Form field with the CSRF token.
CSRF_FIELD = "csrf"
#: Header a script may send the token in (besides ``Authorization: Bearer``).
TOKEN_HEADER = "x-ha-token"
#: Environment variable (and Scrapy setting) read for the token.
TOKEN_ENV = "HA_DASHBOARD_TOKEN"


def session_value(token: str) -> str:
    """What the login cookie holds: proves the token was given, cannot be turned back into it."""
    return hmac.new(token.encode(), b"scrapy-ha dashboard session", hashlib.sha256).hexdigest()


def new_csrf() -> str:
    """A new CSRF session (the cookie's value)."""
    return secrets.token_urlsafe(24)


def new_secret() -> bytes:
    """The key of this server process's form tokens: a restart makes open forms stale."""
    return secrets.token_bytes(32)


def form_token(secret: bytes, session: str) -> str:
    """The CSRF token of the forms of the browser whose CSRF cookie holds *session*: nobody
    without *secret* can make it, whatever cookie they managed to set."""
    return hmac.new(secret, b"scrapy-ha csrf " + session.encode(), hashlib.sha256).hexdigest()


#: ``Sec-Fetch-Site`` values of a request a page of this origin (or the user) made.
OWN_SITES = frozenset({"same-origin", "none"})


def foreign_post(headers: Mapping[str, str], scheme: str) -> str | None:
    """Why a POST with these request *headers* comes from another origin, or None.

    As Go's ``http.CrossOriginProtection`` does: a browser's ``Sec-Fetch-Site`` decides
    (``same-origin``, or ``none`` for what the user did; ``same-site`` is another port of
    this host); without it, the ``Origin`` (``null`` included) must be this server's
    scheme and ``Host``; without an Origin, a ``Referer`` must be (Django's fallback for
    browsers that send no Origin). A request with none of the three comes from no browser
    (curl, a script): nothing a web page can make, so it passes (forms still need their
    token, ``/api/`` its JSON and the dashboard's token when it has one).
    """
    site = headers.get("sec-fetch-site")
    if site is not None:
        return None if site in OWN_SITES else f"Sec-Fetch-Site: {site}"
    own = f"{scheme}://{headers.get('host', '')}".lower()
    origin = headers.get("origin")
    if origin is not None:
        return None if origin.lower() == own else f"Origin: {origin}"
    referer = headers.get("referer")
    if referer is not None:
        parts = urlsplit(referer)
        source = f"{parts.scheme}://{parts.netloc}".lower()
        return None if source == own else f"Referer: {source}"
    return None


def same(a: str | None, b: str) -> bool:
    return a is not None and hmac.compare_digest(a.encode(), b.encode())


def host_name(host_header: str) -> str:
    """``example.com:9411`` -> ``example.com``; ``[::1]:9411`` -> ``[::1]``."""
    if host_header.startswith("["):
        return host_header[: host_header.find("]") + 1]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


def is_loopback_bind(host: str) -> bool:
    return host in LOOPBACK_HOSTS or host.startswith("127.")
