"""Who may read and act: the token, the CSRF token of forms, the Host of a local dashboard.

- With a token (``--token`` / ``HA_DASHBOARD_TOKEN``), every request but the login form
  carries it: header ``Authorization: Bearer <token>`` or ``X-HA-Token``, or the cookie the
  login form sets (a value derived from the token, never the token itself).
- Without one, the dashboard answers only requests addressed to a loopback name, so a web
  page elsewhere cannot reach it by pointing its own host name at 127.0.0.1.
- A form's POST carries the CSRF token of its session cookie (double submit); a POST to
  ``/api/`` must be ``application/json``, which a page of another origin cannot send
  without a preflight this server never grants.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

#: Host names a dashboard without a token answers (its bind address is loopback).
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
#: Cookie that holds the login (derived from the token).
SESSION_COOKIE = "ha_dashboard_session"
#: Cookie that holds the CSRF secret of this browser (forms echo it).
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
    return secrets.token_urlsafe(24)


def same(a: str | None, b: str) -> bool:
    return a is not None and hmac.compare_digest(a.encode(), b.encode())


def host_name(host_header: str) -> str:
    """``example.com:9411`` -> ``example.com``; ``[::1]:9411`` -> ``[::1]``."""
    if host_header.startswith("["):
        return host_header[: host_header.find("]") + 1]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


def is_loopback_bind(host: str) -> bool:
    return host in LOOPBACK_HOSTS or host.startswith("127.")
