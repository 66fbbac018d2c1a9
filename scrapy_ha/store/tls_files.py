"""The TLS files the settings name (``REDIS_TLS_*``), loaded once at start as redis-py
loads them at each connection: a file that is not what its setting says (a certificate
given as the key, a key that does not match its certificate, a CA file that holds no
certificate) fails the start naming the setting, instead of being taken for a Redis that
does not answer until ``HA_START_TIMEOUT`` (a QA run: a minute of "unreachable ... [SSL]
PEM lib" warnings for a key file that held a certificate)."""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, Any

from scrapy_ha.store.redis_params import RedisConfigError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = ["check_tls_files"]


def check_tls_files(given: Mapping[str, Any], password: Any, where: str) -> None:
    """Load *given*'s CA file and client certificate and key (redis-py's arguments
    ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``) into a throwaway context; raise a
    :class:`RedisConfigError` naming the setting whose file does not load. *password*:
    ``REDIS_PARAMS["ssl_password"]`` (a key that needs one and has none is refused, never
    asked for on a terminal)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ca = given.get("ssl_ca_certs")
    if ca:
        try:
            context.load_verify_locations(cafile=ca)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise RedisConfigError(
                f"REDIS_TLS_CA_FILE={ca!r} holds no certificate this client can read "
                f"({_reason(exc)}): give the PEM file of the CA that signed the server's "
                f"certificate (for Redis at {where})"
            ) from exc
    cert, key = given.get("ssl_certfile"), given.get("ssl_keyfile")
    if not (cert or key):
        return
    if not cert:
        raise RedisConfigError(
            f"REDIS_TLS_KEY_FILE={key!r} is set without REDIS_TLS_CERT_FILE: give the client "
            f"certificate that goes with the key (for Redis at {where})"
        )
    try:
        context.load_cert_chain(cert, key, password=_password(password))
    except (ssl.SSLError, OSError, ValueError, TypeError) as exc:
        named = f"REDIS_TLS_CERT_FILE={cert!r}"
        named += f" and REDIS_TLS_KEY_FILE={key!r} do" if key else " does"
        raise RedisConfigError(
            f"{named} not load as a client certificate and its key ({_reason(exc)}): give "
            f"the PEM certificate, and the PEM private key that matches it (its password in "
            f"REDIS_PARAMS['ssl_password'] if it has one) (for Redis at {where})"
        ) from exc


def _password(given: Any) -> Callable[[], str | bytes]:
    """The key's password for ``load_cert_chain``: a callable, so that OpenSSL never
    prompts on a terminal for an encrypted key that was given none."""

    def password() -> str | bytes:
        if given is None:
            raise ValueError("the key is encrypted and REDIS_PARAMS has no ssl_password")
        return given if isinstance(given, str | bytes) else str(given)

    return password


def _reason(exc: BaseException) -> str:
    return str(getattr(exc, "reason", None) or exc) or type(exc).__name__
