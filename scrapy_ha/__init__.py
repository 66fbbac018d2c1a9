"""scrapy-ha: highly available distributed Scrapy crawls around one Redis.

``scrapy_ha.Scheduler`` and ``scrapy_ha.Addon`` are loaded on first use, so that a tool
that only needs a small part of the package (``scrapy-ha --version``) does not import
Scrapy's engine.

The public API is what docs/reference.md documents: this package's ``Scheduler`` and
``Addon``, the modules directly in it (``scrapy_ha.retry``, ``scrapy_ha.proxy``,
``scrapy_ha.checkpoint``, ``scrapy_ha.cookies``, ``scrapy_ha.useragent``, ``scrapy_ha.parent``,
``scrapy_ha.spiders``, ``scrapy_ha.dlq``, ``scrapy_ha.stats``, ``scrapy_ha.keys``,
``scrapy_ha.metakeys``, ``scrapy_ha.verdict``) and ``scrapy_ha.codec``. The subpackages hold
the implementation by job (docs/architecture.md) and may change between releases.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy_ha._version import __version__

if TYPE_CHECKING:
    from scrapy_ha.addon import Addon
    from scrapy_ha.scheduler import Scheduler

__all__ = ["Addon", "Scheduler", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Scheduler":
        from scrapy_ha.scheduler import Scheduler  # noqa: PLC0415 - loaded on first use

        return Scheduler
    if name == "Addon":
        from scrapy_ha.addon import Addon  # noqa: PLC0415 - loaded on first use

        return Addon
    raise AttributeError(f"module 'scrapy_ha' has no attribute {name!r}")
