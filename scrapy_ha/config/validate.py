"""Read one setting and check it: each helper returns a typed value or raises
:class:`ConfigError` naming the setting, the value and what it must be.

The ``*Config.from_settings`` factories in :mod:`scrapy_ha.config.scheduler` are made of these; no
other module reads an ``HA_*`` setting.
"""

from __future__ import annotations

import math
import os
import pkgutil
import re
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import SplitResult, urlsplit

from scrapy_ha.codec.document import setting_names

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.settings import BaseSettings


class ConfigError(ValueError):
    """A setting has a value scrapy-ha cannot use; the message names both."""


def raw(settings: BaseSettings, name: str, default: Any) -> Any:
    """The setting's value, *default* when it is unset or None."""
    value = settings.get(name)
    return default if value is None else value


def url_parts(name: str, url: str, shown: str) -> SplitResult:
    """*url* split, its host read: a ConfigError naming *name* and *shown* (the URL as an
    error may show it) when Python cannot read the host (a ``[`` without its ``]``, an IPv6
    address that is not one), which it says only when the URL is used."""
    try:
        parts = urlsplit(url)
        parts.hostname  # noqa: B018 - a host in brackets is checked when it is read
    except ValueError as exc:
        raise ConfigError(
            f"{name}={shown!r}: its host cannot be read ({exc}); an IPv6 address goes in "
            f"brackets, as in http://[::1]:8000"
        ) from None
    return parts


def raw_or_env(settings: BaseSettings, name: str) -> str:
    """The setting, else the environment variable of the same name, else ``""``."""
    return str(settings.get(name) or os.environ.get(name) or "")


def text(settings: BaseSettings, name: str, default: str) -> str:
    value = raw(settings, name, default)
    if not isinstance(value, str):
        raise ConfigError(f"{name}={value!r} must be a string")
    return value


def choice(settings: BaseSettings, name: str, default: str, choices: tuple[str, ...]) -> str:
    value = raw(settings, name, default)
    if value not in choices:
        listed = " or ".join(repr(c) for c in choices)
        raise ConfigError(f"{name}={value!r} must be one of {listed}")
    return str(value)


def number(settings: BaseSettings, name: str, default: float, *, finite: bool = False) -> float:
    """A number, never ``nan`` (which every comparison lets through: ``nan < 0`` is false,
    so a bound checked after would pass it); with *finite*, not ``inf`` either."""
    value = raw(settings, name, default)
    try:
        if isinstance(value, bool):  # (True was taken as 1 s, where 'True' was refused)
            raise TypeError
        result = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={value!r} is not a number") from None
    if math.isnan(result):
        raise ConfigError(f"{name}={value!r} is not a number (NaN)")
    if finite and not math.isfinite(result):
        raise ConfigError(f"{name}={value!r} must be a finite number")
    return result


def non_negative(
    settings: BaseSettings, name: str, default: float, *, finite: bool = False
) -> float:
    value = number(settings, name, default, finite=finite)
    if value < 0:
        raise ConfigError(f"{name}={raw(settings, name, default)!r} must be 0 or more")
    return value


def fraction(settings: BaseSettings, name: str, default: float) -> float:
    value = non_negative(settings, name, default)
    if value > 1:
        raise ConfigError(f"{name}={value!r} must be between 0 and 1")
    return value


#: The longest duration a setting in seconds may give, unless its own check allows more
#: (about 31.7 years): timers, Redis expiries (ms) and dates all hold it, where ``inf`` or
#: 1e23 stopped a worker in its close, or had Redis refuse every call for ever.
MOST_SECONDS = 1e9


def seconds(
    settings: BaseSettings,
    name: str,
    default: float,
    *,
    zero: bool = False,
    finite: bool = False,
    most: float = MOST_SECONDS,
) -> float:
    """Seconds: more than 0 (or 0 with *zero*), at most *most* (``math.inf`` lets ``inf``
    through: a setting whose own check bounds it, or for which ``inf`` means never); never
    NaN."""
    value = number(settings, name, default, finite=finite)
    if value < 0 or (value == 0 and not zero) or value > most:
        limit = "0 or more" if zero else "more than 0"
        bound = f" (at most {most:g})" if math.isfinite(most) else ""
        raise ConfigError(f"{name}={raw(settings, name, default)!r} must be {limit} seconds{bound}")
    return value


def whole(
    settings: BaseSettings,
    name: str,
    default: int,
    *,
    minimum: int = 1,
    maximum: int | None = None,
    why: str = "",
) -> int:
    """A whole number of *minimum* or more, and *maximum* or fewer if given (*why*: the
    reason for it, said in the error). ``"3"`` is fine, and so are ``1e9``, ``"1e4"`` and
    ``3.0``: a billion URLs is written ``1e9``; ``2.5``, ``True`` and ``"x"`` are not. The
    error quotes the value as given (``1e300``, not its 301 digits)."""
    value = raw(settings, name, default)
    try:
        result = int(value)
    except (TypeError, ValueError, OverflowError):  # (inf)
        result = minimum - 1
    if str(result) != str(value).strip():
        result = _integral(value, minimum - 1)
    if result < minimum:
        raise ConfigError(f"{name}={value!r} must be a whole number of {minimum} or more")
    if maximum is not None and result > maximum:
        raise ConfigError(f"{name}={value!r} must be at most {maximum:,}{why}")
    return result


def _integral(value: Any, otherwise: int) -> int:
    """*value* as the whole number a float or its text writes (``1e9``, ``"1e4"``, ``3.0``),
    else *otherwise*."""
    if isinstance(value, bool) or not isinstance(value, float | str):
        return otherwise
    try:
        number = float(value)
    except ValueError:
        return otherwise
    return int(number) if math.isfinite(number) and number.is_integer() else otherwise


def integer(settings: BaseSettings, name: str, default: int) -> int:
    """A whole number, negative or not (``"-1"`` is fine, ``"x"`` and ``2.5`` are not)."""
    value = raw(settings, name, default)
    try:
        result = int(value)
    except (TypeError, ValueError, OverflowError):  # (inf)
        result = None
    if result is None or str(result) != str(value).strip():
        raise ConfigError(f"{name}={value!r} must be a whole number")
    return result


def mapping(settings: BaseSettings, name: str) -> dict[Any, Any]:
    """A dict, or its JSON text (``-s NAME='{...}'``); empty when unset."""
    try:
        return dict(settings.getdict(name))
    except (TypeError, ValueError):
        raise ConfigError(
            f"{name}={settings.get(name)!r} must be a dict (or its JSON text)"
        ) from None


def statuses(settings: BaseSettings, name: str) -> tuple[int, ...]:
    """HTTP status codes: a list, or its text (``"404,410"``)."""
    try:
        return tuple(int(x) for x in settings.getlist(name))
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={settings.get(name)!r} must be HTTP status codes") from None


#: The text forms of a switch Scrapy's ``getbool`` reads, and what they mean.
_SWITCH_TEXT = {"1": True, "True": True, "true": True, "0": False, "False": False, "false": False}


def boolean(settings: BaseSettings, name: str, default: bool, *, theirs: bool = False) -> bool:
    """A switch, as Scrapy's ``getbool`` reads it, but no other number than 1 and 0:
    ``getbool`` takes ``-1`` and ``"2"`` for True and ``0.5`` for False. A setting of
    Scrapy's or scrapy-redis's own (*theirs*) is read exactly as they read it."""
    if theirs:
        try:
            return settings.getbool(name, default)
        except ValueError:
            raise ConfigError(f"{name}={settings.get(name)!r} must be True or False") from None
    value = settings.get(name, default)
    if isinstance(value, bool):
        return value
    if value is None:
        return default
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value in _SWITCH_TEXT:
        return _SWITCH_TEXT[value]
    raise ConfigError(f"{name}={value!r} must be True or False")


#: A URL scheme as RFC 3986 spells it (lower case: URLs are compared in lower case).
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")


def names(settings: BaseSettings, name: str) -> tuple[Any, ...]:
    """A setting that lists names: a list, or from the command line a JSON list or names
    and commas (:func:`~scrapy_ha.codec.document.setting_names`); anything else refused."""
    value = settings.get(name)
    try:
        return setting_names(value)
    except ValueError as exc:
        raise ConfigError(f"{name}={value!r} {exc}") from None


def schemes(settings: BaseSettings, name: str, default: frozenset[str]) -> frozenset[str]:
    """URL schemes: a list (or ``"http,https"`` or a JSON list from the command line), at
    least one, each a bare scheme name (``"file"``, not ``"file://"``), compared in lower
    case."""
    value = raw(settings, name, default)
    try:
        names = setting_names(value)
    except ValueError:
        names = ()
    if not names:
        raise ConfigError(
            f"{name}={value!r} must be a non-empty list of URL schemes, such as ['http', 'https']"
        )
    found = set()
    for scheme in names:
        clean = scheme.strip().lower() if isinstance(scheme, str) else ""
        if not _SCHEME.fullmatch(clean):
            raise ConfigError(
                f"{name}={value!r}: {scheme!r} is not a URL scheme; give bare scheme names, "
                f"such as ['http', 'https', 'file'] (not 'file://')"
            )
        found.add(clean)
    return frozenset(found)


def given(settings: BaseSettings, name: str) -> bool:
    """Whether the setting has a value at all (its default in Scrapy's settings is None)."""
    return settings.get(name) is not None


def imported(name: str, path: Any, *, shown: str = "") -> Any:
    """*path* imported when it is a dotted path, else *path* itself. Refused naming the
    setting (*shown*: how, else ``NAME=path``) and what its import raised: a module may
    raise anything at import (one that needs its package set up first), which ended the
    worker's start in a traceback."""
    from scrapy.utils.misc import load_object  # (not at import: see scrapy_ha.config.bare)

    try:
        return load_object(path) if isinstance(path, str) else path
    except Exception as exc:  # noqa: BLE001 - a module may raise anything at import
        shown = shown or f"{name}={path!r}"
        raise ConfigError(f"{shown} cannot be imported: {type(exc).__name__}: {exc}") from None


def queue_class(settings: BaseSettings, name: str) -> Any:
    """A class of Scrapy's queue settings (``SCHEDULER_PRIORITY_QUEUE``...), imported when
    a dotted path; None when unset or empty. scrapy-ha reads them for their order and
    builds none of them, so a path that does not import was taken for another order, in
    silence, where Scrapy's own scheduler refuses to start."""
    value = settings.get(name)
    if not value:
        return None
    found = imported(name, value)
    if not isinstance(found, type):
        raise ConfigError(f"{name}={value!r} is not a class (a dotted path to a queue class)")
    return found


def queue_name(settings: BaseSettings, name: str) -> str:
    """The queue class setting *name* as its order is read from: its path as given (the
    classes of ``scrapy.squeues`` are made by a factory: their own names say no order),
    checked to import (:func:`queue_class`)."""
    found = queue_class(settings, name)
    value = settings.get(name)
    if isinstance(value, str) or found is None:
        return value or ""
    import scrapy.squeues  # noqa: PLC0415 - only for a class given as itself

    # (a class given as itself: its name in scrapy.squeues, where it has one; before, the
    # factory's name, ScrapyRequestQueue, was read as LIFO for FifoMemoryQueue too)
    aliases = (n for n, v in vars(scrapy.squeues).items() if v is found and "ifo" in n)
    return next(aliases, f"{found.__module__}.{found.__qualname__}")


def start_key(key: str, spider: str) -> str:
    """``REDIS_START_URLS_KEY`` (*key*) formatted with the *spider*'s name, read where a
    spider reads its start URLs from Redis (``%(nme)s`` ended that worker's start in four
    tracebacks)."""
    try:
        return key % {"name": spider}
    except (KeyError, ValueError, TypeError) as exc:
        raise ConfigError(
            f"REDIS_START_URLS_KEY={key!r} cannot be formatted with the spider's name "
            f"({type(exc).__name__}: {exc}): write it as '%(name)s:start_urls'"
        ) from None


def codec_classes(settings: BaseSettings, name: str) -> tuple[str, ...]:
    """The classes a payload may name (``HA_CODEC_CLASSES``), each checked to import under
    the name a payload gives it (its defining module): a name that does not resolve (a
    typo, a JSON list the command line gave as one name), or that resolves through a
    module re-exporting the class, let the crawl run, and each request naming that class
    was dead-lettered as corrupt."""
    listed = names(settings, name)
    for entry in listed:
        if not isinstance(entry, str) or not (":" in entry or "." in entry):
            raise ConfigError(
                f"{name}={settings.get(name)!r}: {entry!r} is no class name; give "
                f"'module:Class' or 'module.Class' strings"
            )
        try:
            found = pkgutil.resolve_name(entry)
        except Exception as exc:  # noqa: BLE001 - a module may raise anything at import
            raise ConfigError(
                f"{name} names {entry!r}, which cannot be imported: {type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(found, type):
            raise ConfigError(f"{name} names {entry!r}, which is not a class")
        own = f"{found.__module__}:{found.__qualname__}"
        scrapys = found.__module__.startswith("scrapy.")  # (trusted whatever the name)
        if entry not in (own, f"{found.__module__}.{found.__qualname__}") and not scrapys:
            raise ConfigError(
                f"{name} names {entry!r}, which is {own} (another module imports it): "
                f"write it as {own!r}, the name a payload gives it"
            )
    return tuple(listed)


def imported_list(settings: BaseSettings, name: str) -> tuple[type[BaseException], ...]:
    """Every exception class a list setting names (dotted paths or classes)."""
    loaded = []
    for path in names(settings, name):
        found = imported(name, path, shown=f"{name} names {path!r}, which")
        if not (isinstance(found, type) and issubclass(found, BaseException)):
            # (else every failure judged raised a TypeError: each request dead-lettered)
            raise ConfigError(f"{name} names {path!r}, which is not an exception class")
        loaded.append(found)
    return tuple(loaded)


def optional_callable(settings: BaseSettings, name: str) -> Callable[..., Any] | None:
    """A callable named by the setting (a dotted path or the object), None when unset."""
    path = settings.get(name)
    if not path:
        return None
    func = imported(name, path)
    if not callable(func):
        raise ConfigError(f"{name}={path!r} is not callable")
    return cast("Callable[..., Any]", func)
