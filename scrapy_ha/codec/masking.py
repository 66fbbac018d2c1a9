"""What a secret looks like, and the one masking every text that leaves a worker goes through.

The guarantee: **a secret is kept only where a request needs it to be redone, in Redis.**
Everything else a worker or a tool writes — log lines (scrapy-ha's, Scrapy's, the
project's), the stats, what the CLI prints, the report, the webhook, the metrics, the
dashboard's pages and API, the dead-letter records and the SQL archive — goes through this
module, which shows ``***`` instead of:

- a password in a URL's user info (``redis://user:***@host``), of any scheme (Redis,
  proxies, webhooks, SQLAlchemy archive URLs);
- the value of every ``name=value`` pair whose name is secret-looking, in a URL's query,
  path or fragment and in free text (``?password=`` as libpq accepts it,
  ``?accessToken=``, a form body ``user=u&password=...``, a libpq ``password=...``);
- the value of every mapping entry whose key is secret-looking: headers
  (``Authorization``, ``Proxy-Authorization``, ``Cookie``, ``X-Api-Key``...), JSON bodies
  and fields at any depth, ``meta`` and ``cb_kwargs``, settings as Scrapy logs them
  (``'HTTPAUTH_PASS': ...``, ``'HA_DLQ_ALERT_WEBHOOK': ...``);
- every cookie value of a stored request.

A name is secret-looking by its words, whatever the spelling: ``api_key``, ``apiKey``,
``API-KEY``, ``X-Api-Key`` and ``apikey`` are one name (see
:func:`~scrapy_ha.codec.secret_names.secret_name`).

Nothing here imports the rest of scrapy-ha but the stored document's field names, so the
codec and every tool import it without a cycle.
"""

from __future__ import annotations

import binascii
import json
import re
from base64 import b64decode
from typing import Any
from urllib.parse import unquote_plus

from scrapy_ha.codec.secret_names import secret_name

__all__ = [
    "MASK",
    "json_safe",
    "mask_body",
    "mask_headers",
    "mask_text",
    "mask_url",
    "mask_value",
    "masked_json",
    "secret_name",
    "split_userinfo",
]

#: What is shown instead of a secret.
MASK = "***"

#: A cheap first look: text holding none of these (and no ``@``) holds no secret to mask.
_HINTS = (
    *("key", "pass", "pw", "sig", "sid", "auth", "token", "secret", "session", "cookie"),
    *("credential", "jwt", "otp", "bearer", "basic", "webhook", "dsn"),
)


def _may_hold_secret(text: str) -> bool:
    if "@" in text:
        return True
    lower = text.lower()
    return any(hint in lower for hint in _HINTS)


# -------------------------------------------------------------------------- URLs and text

#: ``name=value`` after a start, ``?``, ``&``, ``;`` or ``#`` (queries, fragments, path
#: parameters, form bodies, libpq conninfo); the value ends at the next separator.
_PAIR = re.compile(r"(?P<lead>^|[?&;#\s])(?P<name>[^&;=#?\s'\"<>]+)=(?P<value>[^&;#?\s'\"<>]*)")
#: A URL with a scheme, in free text (it ends at whitespace, a quote or an angle bracket):
#: its scheme begins at the first letter of a run of a scheme's characters (``1http://``:
#: ``http://``), tried once per run: tried at every letter of a long run (``a-a-a-...``),
#: each try scanned the rest of the run, quadratic in its length.
_URL_IN_TEXT = re.compile(
    r"(?<![A-Za-z0-9+.\-])(?P<lead>[0-9+.\-]*)"
    r"(?P<url>[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>\\]+)"
)
#: ``user:password@host`` without a scheme in free text: the authority of a URL as an
#: error quotes it (Twisted's ``invalid hostname: user:pw@host`` of a request whose URL
#: holds credentials, a QA run). Not right after a character of a user name, ``/``,
#: ``:`` or ``@`` (a URL's own, masked by :func:`mask_url` first), so it is tried once per
#: run of such characters: linear time.
_BARE_USERINFO = re.compile(
    r"(?<![A-Za-z0-9/:@%.~_!$&*+;=-])(?P<user>[A-Za-z0-9._~%!$&*+;=-]+)"
    r":(?P<pw>[^\s/@'\"<>]+)@(?=[A-Za-z0-9\[])"
)
#: The parts of a URL: scheme, user info (up to the last ``@`` of the authority), the rest.
_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<netloc>[^/?#]*)(?P<rest>.*)$", re.S)
#: A quoted name (``b'...'`` too), and a value as a repr writes it: a quoted string or a
#: bracketed list (shared by the mapping entries and the pairs below).
_QUOTED_NAME = r"""b?(?P<q>['"])(?P<name>[^'"\n]{1,200})(?P=q)"""
_QUOTED_VALUE = r"""b?'(?:[^'\\\n]|\\.)*'|b?"(?:[^"\\\n]|\\.)*"|\[[^\]\n]*\]"""
#: ``'name': value`` or ``"name": value`` as a repr, pformat or JSON writes a mapping; the
#: value is a quoted string, a bracketed list, or a bare word.
_QUOTED_PAIR = re.compile(
    rf"""(?P<key>{_QUOTED_NAME}\s*:\s*)(?P<value>{_QUOTED_VALUE}|[^,{{}}\[\s][^,}}\s]*)"""
)
#: ``(name, value)`` as the repr of a list of pairs writes one (``list(headers.items())``,
#: ``(b'X-Api-Key', [b'...'])``): after ``(``, a quoted name, then a quoted value or a list.
_QUOTED_TUPLE = re.compile(rf"(?P<key>\(\s*{_QUOTED_NAME}\s*,\s*)(?P<value>{_QUOTED_VALUE})")
#: ``Name: value`` at the start of a line (a header block in a message).
_HEADER_LINE = re.compile(r"(?m)^(?P<name>[A-Za-z][A-Za-z0-9_-]*):[ \t]+(?P<value>[^\r\n]+)")
#: A secret ``name: value`` inside a line (``HTTP 401 (Authorization: Bearer x)``, ``Telnet
#: Password: x``), where a header line's own pattern needs the line to start with its
#: name: a name as headers are written (with a hyphen, or Authorization or Cookie), or one
#: that ends in a word no ordinary text ends a name with (``password``, ``token``...:
#: "pass: 2 of 5" and "sort key: name" stay), starting where a word starts (each run of
#: letters and hyphens tried once: linear on any line).
_HEADER_IN_LINE = re.compile(
    r"(?<![A-Za-z0-9_-])(?P<name>[A-Za-z][A-Za-z0-9_]*(?:-[A-Za-z0-9_]+)+"
    r"|(?i:authorization|cookie)"
    r"|[A-Za-z0-9_]*(?i:password|passwd|passphrase|token|secret|apikey|api_key)):[ \t]+"
    r"(?P<scheme>(?i:bearer|basic|digest|negotiate|token)[ \t]+)?(?P<value>[^\s,;)\]}'\"]+)"
)
_BEARER = re.compile(r"(?i)\bBearer[ \t]+[A-Za-z0-9._~+/=-]{16,}")
#: HTTP Basic credentials alone (``Basic YWxpY2U6cHc=``: the base64 of ``user:password``,
#: the password as good as in clear), as a callback quoting its request's Authorization
#: header prints them; masked where they decode to such a pair ("Basic authentication" and
#: ``Basic realm="x"`` stay).
_BASIC = re.compile(r"(?i)\b(?P<scheme>Basic[ \t]+)(?P<pair>[A-Za-z0-9+/]{4,}={0,2})(?![\w+/=])")


def _mask_basic(match: re.Match[str]) -> str:
    try:
        pair = b64decode(match["pair"], validate=True)
    except (binascii.Error, ValueError):
        return match[0]
    return match["scheme"] + MASK if b":" in pair else match[0]


def _mask_pair(match: re.Match[str]) -> str:
    name = match["name"]
    if match["value"] in ("", MASK) or not secret_name(unquote_plus(name)):
        return match[0]
    return f"{match['lead']}{name}={MASK}"


#: A value masked, then a ``#`` and more: the rest of a secret that held an unencoded ``#``
#: (``?password=s3cr#et``), which a URL reads as its fragment.
_MASKED_THEN_FRAGMENT = re.compile(r"(=\*\*\*)#[^\s'\"<>]*")


def _mask_pairs(text: str) -> str:
    if "=" not in text:
        return text
    text = _PAIR.sub(_mask_pair, text)
    return _MASKED_THEN_FRAGMENT.sub(r"\1", text) if f"={MASK}#" in text else text


#: A host and its port in a URL whose user info holds ``/``, ``?`` or ``#`` (a list of them,
#: comma-separated: a Sentinel or Cluster URL). A port that is no number (``:5x``, a typo)
#: too: the error that refuses such a URL shows it, masked.
_LOOSE_HOST = r"(?:[A-Za-z0-9_.\-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9A-Za-z]{1,8})?"
#: A URL whose password holds ``/``, ``?`` or ``#`` unencoded (generated passwords often
#: do): the user info runs up to the last ``@`` that a host (and port) follows, then the
#: end, a path, a query or a fragment. ``_URL`` alone would end the authority at the first
#: ``/``, ``?`` or ``#`` and find no password to mask.
_LOOSE_START = r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/?#@:\s\[\]]*:\S*)"
_LOOSE_USERINFO = re.compile(
    rf"{_LOOSE_START}@(?P<host>{_LOOSE_HOST}(?:,{_LOOSE_HOST})*)(?=[/?#]|$)", re.S
)
#: The same, of one host (a proxy's URL): the config refuses a URL it matches (see
#: split_userinfo); ``?emails=a@b,c`` in a query is no list of hosts.
LOOSE_USERINFO = re.compile(rf"{_LOOSE_START}@(?P<host>{_LOOSE_HOST})(?=[/?#]|$)", re.S)


def split_userinfo(url: str) -> tuple[str, str, str, str] | None:
    """``(scheme://, userinfo, host[:port], rest)`` of a URL with user info, else None.

    The user info ends at the last ``@`` of the authority; when the authority (up to the
    first ``/``, ``?`` or ``#``) holds no ``@`` but reads ``user:text`` and an ``@`` and a
    host follow later, the password is taken to hold ``/``, ``?`` or ``#`` unencoded
    (``http://u:Xk/9#s@proxy:8000``). ``http://host:8080/p?mail=a@b`` is no such URL: what
    follows the colon there is a port.
    """
    parts = _URL.match(url)
    if parts is None:
        return None
    netloc = parts["netloc"]
    loose = _LOOSE_USERINFO.match(url)
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if loose is not None and len(loose["userinfo"]) > len(userinfo) and "=" not in loose[0]:
            # a password holding '@' and then '/', '?' or '#' (``:p@ss#w@host``): the
            # authority ends at the '#', and a part of the password would read as a host
            return loose["scheme"], loose["userinfo"], loose["host"], url[loose.end() :]
        return parts["scheme"], userinfo, host, parts["rest"]
    if loose is None or netloc.partition(":")[2].isdigit() or netloc.endswith(":"):
        return None
    return loose["scheme"], loose["userinfo"], loose["host"], url[loose.end() :]


def _port_like_password(url: str) -> tuple[str, str, str, str] | None:
    """A URL :func:`split_userinfo` reads as a host and a port, whose whole rest is a path
    that ends at ``@host:port`` (``http://user:123/abc@proxy:8080``): a proxy URL whose
    password starts with digits then ``/``, ``?`` or ``#``. Masked as one, though another
    reading exists (a host, a port and a path holding ``@``): a URL masked too much is
    a log line less exact, one masked too little is a password in the log."""
    loose = _LOOSE_USERINFO.match(url)
    if loose is None or ":" not in loose["host"].rpartition("]")[2] or url[loose.end() :]:
        return None
    return loose["scheme"], loose["userinfo"], loose["host"], ""


def mask_url(url: str) -> str:
    """*url* fit to print: the password of its user info and the values of its secret
    parameters (query, fragment, path parameters) become ``***``.

    ``redis://user:s3cret@host`` -> ``redis://user:***@host``;
    ``postgresql+psycopg://u@h/db?password=pw`` -> ``...?password=***``;
    ``https://api.example/?accessToken=t&page=2`` -> ``...?accessToken=***&page=2``.
    """
    split = split_userinfo(url) or _port_like_password(url)
    if split is not None:
        scheme, userinfo, host, rest = split
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:{MASK}@{host}" if colon else f"{userinfo}@{host}"
        return f"{scheme}{netloc}{_mask_pairs(rest)}"
    parts = _URL.match(url)
    if parts is None:
        return _mask_pairs(_mask_schemeless_userinfo(url))
    return f"{parts['scheme']}{parts['netloc']}{_mask_pairs(parts['rest'])}"


#: In what precedes a schemeless URL's last ``@``: up to the first ``:`` that a ``/`` does
#: not follow (``redis//:pw``, ``redis:/:pw``, ``user:pw``), where its password starts.
_SCHEMELESS_USER = re.compile(r"^[^:]*(?::/[^:]*)*:(?=[^/])")


def _mask_schemeless_userinfo(url: str) -> str:
    """A URL whose ``://`` a typo lost (``redis//:pw@host``): all from where its password
    starts to its last ``@`` masked (its password may hold ``:`` or ``/``; masked too much,
    an error is a little less exact, masked too little, it shows the password)."""
    head, at, host = url.rpartition("@")
    user = _SCHEMELESS_USER.match(head) if at else None
    return f"{user[0]}{MASK}@{host}" if user else url


def _mask_quoted_pair(match: re.Match[str]) -> str:
    if not secret_name(match["name"]):
        return match[0]
    return f"{match['key']}{match['q']}{MASK}{match['q']}"  # JSON stays JSON


def _mask_header_line(match: re.Match[str]) -> str:
    if not secret_name(match["name"]):
        return match[0]
    return f"{match['name']}: {MASK}"


def _mask_header_in_line(match: re.Match[str]) -> str:
    if match["value"] == MASK or not secret_name(match["name"]):
        return match[0]
    return f"{match['name']}: {match['scheme'] or ''}{MASK}"


def mask_text(text: str) -> str:
    """Free text (a log line, a reason, an exception, a body) fit to print: every URL in it
    masked as :func:`mask_url` does, and the values of secret-looking ``name=value`` pairs,
    ``'name': value`` mapping entries, ``('name', value)`` pairs and ``Name: value`` header
    lines become ``***``."""
    if not _may_hold_secret(text):
        return text
    text = _URL_IN_TEXT.sub(lambda m: m["lead"] + mask_url(m["url"]), text)
    text = _BARE_USERINFO.sub(lambda m: f"{m['user']}:{MASK}@", text)
    text = _QUOTED_PAIR.sub(_mask_quoted_pair, text)
    text = _QUOTED_TUPLE.sub(_mask_quoted_pair, text)
    text = _HEADER_LINE.sub(_mask_header_line, text)
    text = _HEADER_IN_LINE.sub(_mask_header_in_line, text)
    text = _BEARER.sub(f"Bearer {MASK}", text)
    text = _BASIC.sub(_mask_basic, text)
    return _mask_pairs(text)


def mask_value(value: Any) -> Any:
    """A copy of a JSON-like value fit to print: the value of every key that names a secret
    becomes ``***`` (at any depth), every string is masked as free text."""
    if isinstance(value, dict):
        return {
            k: MASK if isinstance(k, (str, bytes)) and secret_name(k) else mask_value(v)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [mask_value(v) for v in value]
    if isinstance(value, str):
        return mask_text(value)
    return value


def masked_json(record: dict[str, Any]) -> str:
    """*record* masked (:func:`mask_value`) as compact JSON that every reader takes: strict
    JSON, which Redis's cjson can encode again (it refuses NaN and infinities, which
    ``json.dumps`` writes by default). A value JSON cannot hold (NaN or an infinity in a
    user's verdict mapping, an object) becomes null; a record that still cannot be written
    keeps its class and reason only."""
    shown = mask_value(record)
    try:
        return json.dumps(shown, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        pass
    try:
        return json.dumps(json_safe(shown), separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        kept = {k: str(shown.get(k, "")) for k in ("class", "reason")}
        return json.dumps({**kept, "record": "unreadable"}, separators=(",", ":"))


def json_safe(value: Any) -> Any:
    """*value* (a JSON-like value) with what strict JSON cannot hold as null (NaN, infinities,
    objects; keys as text)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and value - value != 0:  # NaN, inf, -inf
        return None
    if value is None or isinstance(value, (str, int, float)):
        return value
    return None


def mask_headers(headers: Any) -> dict[str, Any]:
    """Headers (a mapping of names to values or lists of values, str or bytes) as text,
    the values of secret headers ``***``."""
    shown: dict[str, Any] = {}
    for name, values in dict(headers).items():
        key = _as_text(name)
        shown[key] = MASK if secret_name(key) else _header_values(values)
    return shown


def _header_values(values: Any) -> Any:
    if isinstance(values, (list, tuple)):
        return [mask_text(_as_text(v)) for v in values]
    return mask_text(_as_text(values))


def _as_text(value: Any) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else str(value)


# -------------------------------------------------------------------------- bodies


#: A multipart part: its ``name="..."`` and its value (up to the next boundary).
_MULTIPART = re.compile(
    r'(?P<head>name="(?P<name>[^"]*)"[^\r\n]*\r\n(?:[^\r\n]+\r\n)*\r\n)(?P<value>.*?)(?=\r\n--)',
    re.S,
)


def mask_body(raw: bytes) -> bytes:
    """A request body fit to print: in a JSON body the values of secret-looking fields at
    any depth, in a form (``user=u&password=...``) or multipart body the values of
    secret-looking fields, in other text what :func:`mask_text` masks. A body with nothing
    to mask is returned as it is (so is one that is not text)."""
    if not raw:
        return raw
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        doc = None
    if isinstance(doc, (dict, list)):
        masked = mask_value(doc)
        if masked == doc:
            return raw
        # a lone surrogate (the body's "\ud800") can only be in a string: its escape
        return json.dumps(masked, ensure_ascii=False).encode("utf-8", "backslashreplace")
    text = raw.decode("latin-1")  # every byte is one character: nothing is lost
    shown = _MULTIPART.sub(_mask_part, text) if 'name="' in text else text
    shown = mask_text(shown)
    return raw if shown == text else shown.encode("latin-1")


def _mask_part(match: re.Match[str]) -> str:
    return f"{match['head']}{MASK}" if secret_name(match["name"]) else match[0]
