"""The TLS files the settings name (``REDIS_TLS_*``), loaded once at start as redis-py
loads them at each connection: a file that is not what its setting says (a certificate
given as the key, a key that does not match its certificate, a CA file that holds no
certificate) fails the start naming the setting, instead of being taken for a Redis that
does not answer until ``HA_START_TIMEOUT`` (a QA run: a minute of "unreachable ... [SSL]
PEM lib" warnings for a key file that held a certificate)."""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from scrapy_ha.store.redis_params import RedisConfigError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = ["check_client_tls", "check_tls_files"]

#: redis-py's arguments of the files checked, with the setting of each (REDIS_TLS_*).
FILE_ARGS = {
    "ssl_ca_certs": "REDIS_TLS_CA_FILE",
    "ssl_certfile": "REDIS_TLS_CERT_FILE",
    "ssl_keyfile": "REDIS_TLS_KEY_FILE",
}


def check_client_tls(
    tls: Mapping[str, Any], params: Mapping[str, Any], url: str, where: str
) -> None:
    """:func:`check_tls_files` of the files and password the client gets: those of
    ``REDIS_PARAMS``, the ``REDIS_TLS_*`` settings' (*tls*) over them, and the URL's query
    over both (redis-py's ``from_url`` takes it last). Before, the settings' alone: a key
    in ``REDIS_PARAMS`` or a password in the URL, which redis-py takes, failed the start
    (a review)."""
    query = dict(parse_qsl(urlsplit(url).query)) if url else {}
    given: dict[str, Any] = {}
    named: dict[str, str] = {}
    for source, name_of in (
        (params, "REDIS_PARAMS[{arg!r}]"),
        (tls, "{setting}"),
        (query, "REDIS_URL's {arg}"),
    ):
        for arg, setting in FILE_ARGS.items():
            if source.get(arg):
                given[arg] = source[arg]
                named[arg] = name_of.format(arg=arg, setting=setting)
    password = query.get("ssl_password") or params.get("ssl_password")
    check_tls_files(given, password, where, named)


def check_tls_files(
    given: Mapping[str, Any], password: Any, where: str, named: Mapping[str, str] | None = None
) -> None:
    """Load *given*'s CA file and client certificate and key (redis-py's arguments
    ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``) into a throwaway context; raise a
    :class:`RedisConfigError` naming the setting whose file does not load (*named*: arg ->
    how to name it, by default its ``REDIS_TLS_*`` setting). *password*:
    ``REDIS_PARAMS["ssl_password"]`` (a key that needs one and has none is refused, never
    asked for on a terminal)."""
    names = {**FILE_ARGS, **(named or {})}
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ca = given.get("ssl_ca_certs")
    if ca:
        try:
            context.load_verify_locations(cafile=ca)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise RedisConfigError(
                f"{names['ssl_ca_certs']}={ca!r} holds no certificate this client can read "
                f"({_reason(exc)}): give the PEM file of the CA that signed the server's "
                f"certificate (for Redis at {where})"
            ) from exc
    cert, key = given.get("ssl_certfile"), given.get("ssl_keyfile")
    if not (cert or key):
        return
    if not cert:
        raise RedisConfigError(
            f"{names['ssl_keyfile']}={key!r} is set without {names['ssl_certfile']}: give "
            f"the client certificate that goes with the key (for Redis at {where})"
        )
    try:
        context.load_cert_chain(cert, key, password=_password(password))
    except (ssl.SSLError, OSError, ValueError, TypeError) as exc:
        said = f"{names['ssl_certfile']}={cert!r}"
        said += f" and {names['ssl_keyfile']}={key!r} do" if key else " does"
        raise RedisConfigError(
            f"{said} not load as a client certificate and its key ({_reason(exc)}): give "
            f"the PEM certificate, and the PEM private key that matches it (its password in "
            f"REDIS_PARAMS['ssl_password'] if it has one) (for Redis at {where})"
        ) from exc


def _password(given: Any) -> Callable[[], str | bytes]:
    """The key's password for ``load_cert_chain``: a callable, so that OpenSSL never
    prompts on a terminal for an encrypted key that was given none."""

    def password() -> str | bytes:
        if given is None:
            raise ValueError("the key is encrypted and no ssl_password is given")
        return given if isinstance(given, str | bytes) else str(given)

    return password


def _reason(exc: BaseException) -> str:
    return str(getattr(exc, "reason", None) or exc) or type(exc).__name__
