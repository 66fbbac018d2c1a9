"""What a secret's name looks like: a header, a parameter, a field or a setting whose value
:mod:`~scrapy_ha.codec.masking` shows as ``***``."""

from __future__ import annotations

import functools
import re

__all__ = ["SECRET_ENDINGS", "SECRET_WORDS", "secret_name"]

#: Last words of a secret's name (``http_pass``, ``X-Api-Key``, ``secretKey``, ``sig``):
#: the last word of a compound name says what it is (``token_type`` is no token).
SECRET_WORDS = frozenset(
    {
        "auth",
        "authentication",
        "authorization",
        "bearer",
        "cookie",
        "credential",
        "credentials",
        "dsn",  # a Sentry-style DSN carries its key
        "jwt",
        "key",
        "otp",
        "pass",
        "passphrase",
        "passwd",
        "password",
        "pw",
        "pwd",
        "secret",
        "session",
        "sid",
        "sig",
        "signature",
        "token",
        "webhook",  # a chat webhook's path is its secret
    }
)
#: Endings of one-word names written without separators (``apikey``, ``accesstoken``,
#: ``csrfmiddlewaretoken``, ``jsessionid``, ``phpsessid``): long enough that no everyday
#: word ends with them (``monkey`` ends with "key", ``bypass`` with "pass": not these).
SECRET_ENDINGS = (
    "accesskey",
    "apikey",
    "authkey",
    "authorization",
    "cookie",
    "credential",
    "credentials",
    "passphrase",
    "passwd",
    "password",
    "privatekey",
    "secret",
    "secretkey",
    "sessid",
    "sessionid",
    "signature",
    "token",
)
#: The words of a name: ``X-API-Key`` -> X, API, Key; ``accessToken`` -> access, Token.
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def secret_name(name: str | bytes) -> bool:
    """Is *name* (a header, a parameter, a field, a setting) the name of a secret?

    Case and spelling do not matter: snake_case, camelCase, kebab-case, dotted or run
    together (``access_token``, ``accessToken``, ``Access-Token``, ``accesstoken``). The
    last word decides (``api_key_id`` is an id), or the last two run together
    (``Session-Id``), or a one-word name's ending (``apikey``).
    """
    if isinstance(name, bytes):
        name = name.decode("latin-1")
    return _secret_words(name)


@functools.lru_cache(maxsize=4096)  # the same few names come back on every line
def _secret_words(name: str) -> bool:
    words = [w.lower() for w in _WORD.findall(name) if not w.isdigit()]
    if not words:
        return False
    last = words[-1]
    pair = "".join(words[-2:])
    return last in SECRET_WORDS or last.endswith(SECRET_ENDINGS) or pair.endswith(SECRET_ENDINGS)
