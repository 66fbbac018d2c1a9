"""Masked log lines and printed output: every log record of the process, and what the CLI
prints, go through :func:`scrapy_ha.codec.masking.mask_text` (moved out of
:mod:`scrapy_ha.codec.masking`)."""

from __future__ import annotations

import logging
import re
import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from scrapy_ha.codec.masking import mask_text

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["install_log_masking", "masked_output", "visible"]


# -------------------------------------------------------------------------- log lines


class _MaskedRecord(logging.LogRecord):
    """A log record whose message and traceback are masked when a handler formats them."""

    def getMessage(self) -> str:  # noqa: N802 - logging's name
        return mask_text(super().getMessage())

    @property
    def exc_text(self) -> str | None:
        text: str | None = self.__dict__.get("_masked_exc_text")
        return text

    @exc_text.setter
    def exc_text(self, text: str | None) -> None:
        self.__dict__["_masked_exc_text"] = None if text is None else mask_text(text)


def _masking_factory(previous: Any) -> Any:
    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record: logging.LogRecord = previous(*args, **kwargs)
        if type(record) is logging.LogRecord:
            record.__class__ = _MaskedRecord
        return record

    factory.masks_secrets = True  # type: ignore[attr-defined]
    return factory


def install_log_masking() -> None:
    """Mask every log line of this process from now on (scrapy-ha's, Scrapy's, the
    project's, a library's): a record's message and traceback are masked as
    :func:`mask_text` masks text, when a handler formats it (a record no handler writes
    costs nothing). Idempotent; the add-on calls it before Scrapy logs its settings."""
    current = logging.getLogRecordFactory()
    if not getattr(current, "masks_secrets", False):
        logging.setLogRecordFactory(_masking_factory(current))


# -------------------------------------------------------------------------- printed output


#: Characters a terminal acts on rather than shows: C0 controls but tab, newline and
#: carriage return (a CSV line's end, which a project's pipeline may print), DEL, C1
#: controls, and the bidirectional overrides and isolates that reorder what follows; and
#: lone surrogates, which no output encoding can write (``dlq show`` of a request whose
#: meta held one, as text decoded with ``surrogateescape``, failed with a traceback).
_CONTROLS = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


def _escaped(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def visible(text: str) -> str:
    """*text* with the characters a terminal would act on written as ``\\u001b``: what the
    CLI prints comes from sites and spiders (a reason, a URL, a class), and an escape
    sequence in it could clear the screen, retitle the window or hide what follows. In a
    JSON string, where such characters appear only escaped or raw, the escape means the
    same character: JSON output keeps its value."""
    return _CONTROLS.sub(_escaped, text)


def one_line(text: str) -> str:
    """*text* on one line, its line breaks and runs of whitespace one space each: a field of
    a listing (a reason is an exception's text, which may hold a page's: its carriage return
    wrote the rest over the line's start in a terminal, its newline looked like a line of
    its own). What a terminal would act on is left to :func:`visible`."""
    return " ".join(text.split())


_SURROGATES = re.compile("[\ud800-\udfff]")


def escape_surrogates(value: Any) -> Any:
    """*value* (strings, and those in dicts, lists and tuples at any depth) with each lone
    surrogate written as its escape (``\\ud800``): text no encoding can write otherwise (a
    JSON answer, an HTML page), from a request whose meta or body held one."""
    if isinstance(value, str):
        return _SURROGATES.sub(_escaped, value)
    if isinstance(value, dict):
        return {escape_surrogates(k): escape_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [escape_surrogates(v) for v in value]
    if type(value) is tuple:
        return tuple(escape_surrogates(v) for v in value)
    return value


class _MaskedStream:
    """A text stream whose writes are masked as :func:`mask_text` masks text, and made
    :func:`visible`; :meth:`write_raw` writes a terminal control of the CLI's own."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(visible(mask_text(text)))
        return len(text)

    def write_raw(self, text: str) -> int:
        """Write *text* as it is (``--watch``'s cursor moves and clears)."""
        written: int = self._stream.write(text)
        return written

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding...
        return getattr(self._stream, name)


@contextmanager
def masked_output() -> Iterator[None]:
    """Mask what is printed to stdout and stderr within the block (the CLI's output: every
    command's, a subcommand of the future's too)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _MaskedStream(sys.stdout), _MaskedStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
