"""Settings read without importing Scrapy, where only settings Scrapy has no default for
are read.

Importing Scrapy is half of a ``scrapy-ha`` command's start (about 0.5 s of CPU of 1.1 s).
A command outside a Scrapy project, or a tool given a Redis URL alone, reads only
scrapy-ha's own settings (``HA_*``) and the Redis ones (``REDIS_*``): Scrapy has no default
for either, so :class:`BareSettings` reads them as an empty ``scrapy.settings.Settings``
would. A read of any other name (one Scrapy may have a default for) is answered by Scrapy's
``Settings``, built then with the same values: no read differs from Scrapy's, only the
import is put off until one needs it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

#: The names read here; any other is Scrapy's to answer.
OWN_PREFIXES = ("HA_", "REDIS_")
#: scrapy.settings.SETTINGS_PRIORITIES (the same in every supported Scrapy)
PRIORITIES = {"default": 0, "command": 10, "addon": 15, "project": 20, "spider": 30, "cmdline": 40}


class BareSettings:
    """Scrapy's default settings plus what is :meth:`set`, Scrapy imported only when a
    name outside :data:`OWN_PREFIXES` is read or set."""

    def __init__(self, values: dict[str, Any] | None = None) -> None:
        self._values: dict[str, tuple[Any, int]] = {}
        self._scrapy: BaseSettings | None = None
        for name, value in (values or {}).items():
            self.set(name, value)

    @classmethod
    def of(cls, values: dict[str, Any] | None = None) -> BaseSettings:
        """A BareSettings typed as what it stands for (it answers Scrapy's read API)."""
        return cast("BaseSettings", cls(values))

    def _full(self) -> BaseSettings:
        if self._scrapy is None:
            from scrapy.settings import Settings

            self._scrapy = Settings()
            for name, (value, priority) in self._values.items():
                self._scrapy.set(name, value, priority=priority)
        return self._scrapy

    @staticmethod
    def _own(name: Any) -> bool:
        return isinstance(name, str) and name.startswith(OWN_PREFIXES)

    def set(self, name: str, value: Any, priority: int | str = "project") -> None:
        level = PRIORITIES[priority] if isinstance(priority, str) else priority
        if self._scrapy is not None or not self._own(name):
            self._full().set(name, value, priority=level)
        if self._own(name) and level >= self._values.get(name, (None, -1))[1]:
            self._values[name] = value, level

    def __getitem__(self, name: str) -> Any:
        if self._scrapy is not None or not self._own(name):
            return self._full()[name]
        return self._values.get(name, (None, 0))[0]

    def __contains__(self, name: Any) -> bool:
        if self._scrapy is not None or not self._own(name):
            return name in self._full()
        return name in self._values

    def get(self, name: str, default: Any = None) -> Any:
        value = self[name]
        return default if value is None else value

    def getbool(self, name: str, default: bool = False) -> bool:
        got = self.get(name, default)
        try:
            return bool(int(got))
        except ValueError:
            if got in {"True", "true"}:
                return True
            if got in {"False", "false"}:
                return False
            raise ValueError(
                "Supported values for boolean settings are 0/1, True/False, '0'/'1', "
                "'True'/'False' and 'true'/'false'"
            ) from None

    def getint(self, name: str, default: int = 0) -> int:
        return int(self.get(name, default))

    def getfloat(self, name: str, default: float = 0.0) -> float:
        return float(self.get(name, default))

    def getlist(self, name: str, default: list[Any] | None = None) -> list[Any]:
        value = self.get(name, default or [])
        if not value:
            return []
        return list(value.split(",") if isinstance(value, str) else value)

    def getdict(self, name: str, default: dict[Any, Any] | None = None) -> dict[Any, Any]:
        value = self.get(name, default or {})
        return dict(json.loads(value) if isinstance(value, str) else value)

    def __getattr__(self, attr: str) -> Any:  # the rest of Scrapy's API: Scrapy's own
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(self._full(), attr)
