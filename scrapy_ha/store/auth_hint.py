"""What a refused login to Redis says: a Redis that asks for a password the URL does not give
is said to ask for one (a QA run: Redis 7 answers such a client about ``HELLO``, and the
message said it "refused the credentials" of a URL that gave none)."""

from __future__ import annotations

__all__ = ["refused_login"]

#: What Redis answers a client that gave no password: Redis 7 to its HELLO, Redis 6 (NOAUTH).
_NONE_GIVEN = ("client already authenticated", "Authentication required")


def refused_login(url: str, reason: str) -> str:
    """``Redis at URL asks for a password and none was given (reason)``, or ``... refused
    the credentials (reason)`` for a wrong one; the caller adds where to give them."""
    if any(text in reason for text in _NONE_GIVEN):
        return f"Redis at {url} asks for a password and none was given ({reason})"
    return f"Redis at {url} refused the credentials ({reason})"
