"""``scrapy_ha.Addon``: wires everything scrapy-ha offers into a project.

``ADDONS = {"scrapy_ha.Addon": 0}`` sets the scheduler and switches off
Scrapy's remote-control server on workers (unless the project set it).
Settings the project already set at a higher priority are left alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

#: What the add-on sets, at "addon" priority.
ADDON_SETTINGS = {
    "SCHEDULER": "scrapy_ha.Scheduler",
    "REMOTE_CONTROL_ENABLED": False,
}


class Addon:
    """Enable with ``ADDONS = {"scrapy_ha.Addon": 0}``."""

    def update_settings(self, settings: BaseSettings) -> None:
        for name, value in ADDON_SETTINGS.items():
            settings.set(name, value, priority="addon")
