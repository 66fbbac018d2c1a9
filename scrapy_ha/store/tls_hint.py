"""What an unreachable Redis's message adds when the URL's TLS may not be the port's: a QA
run's ``rediss://`` URL of a plain port timed out, a ``redis://`` URL of a TLS port, or a
``rediss://`` URL without the client certificate the server asks for, were reset, and the
messages ("timed out", "Connection reset by peer") did not hint at TLS."""

from __future__ import annotations

__all__ = ["tls_hint"]

#: What redis-py says of a connection the server closed at once.
_CLOSED = ("reset by peer", "closed by server", "Connection lost")


def tls_hint(exc: BaseException, url: str) -> str:
    """A clause (from ``"; "``) to add to *exc*'s reason when the scheme of *url* (as shown)
    may not match the port's TLS, else ``""``."""
    tls = url.startswith(("rediss://", "rediss+"))  # (+sentinel, +cluster: a review)
    if tls and _timed_out(exc):
        return (
            "; a port that does not speak TLS does not answer a rediss:// URL: if "
            "redis-server there is not TLS, the URL is redis://"
        )
    if _certificate_required(exc) or (tls and _closed(exc)):
        return (
            "; a TLS server that asks for a client certificate (tls-auth-clients, on by "
            "default) closes a connection that gives none it trusts: give REDIS_TLS_CERT_FILE "
            "and REDIS_TLS_KEY_FILE"
        )
    if url.startswith(("redis://", "redis+")) and _closed(exc):
        return (
            "; a TLS port closes a plain connection: if redis-server there speaks TLS "
            "(tls-port), the URL is rediss:// (rediss+sentinel://, rediss+cluster://)"
        )
    return ""


def _chain(exc: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and len(found) < 8:  # redis-py's errors wrap the socket's
        found.append(cause)
        cause = cause.__cause__ or cause.__context__
    return found


def _timed_out(exc: BaseException) -> bool:
    return any(
        isinstance(e, TimeoutError) or any(w in str(e).lower() for w in ("timed out", "timeout"))
        for e in _chain(exc)
    )


def _closed(exc: BaseException) -> bool:
    return any(
        isinstance(e, ConnectionResetError) or any(word in str(e) for word in _CLOSED)
        for e in _chain(exc)
    )


def _certificate_required(exc: BaseException) -> bool:
    """The server's TLS alert, when the client read it before the connection closed."""
    return any("CERTIFICATE_REQUIRED" in str(e) for e in _chain(exc))
