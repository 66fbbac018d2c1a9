"""An item sink that survives SIGKILL: each item is one unbuffered append."""

from __future__ import annotations

import json
import os
from typing import Any

from scrapy.exceptions import NotConfigured


class AppendJsonLinesPipeline:
    """Append each item as a JSON line to the file named by the ITEMS_FILE setting."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @classmethod
    def from_crawler(cls, crawler: Any) -> AppendJsonLinesPipeline:
        path = crawler.settings.get("ITEMS_FILE")
        if not path:
            raise NotConfigured("ITEMS_FILE is not set")
        return cls(path)

    def process_item(self, item: Any) -> Any:
        os.write(self.fd, (json.dumps(dict(item), sort_keys=True) + "\n").encode())
        return item

    def close_spider(self) -> None:
        os.close(self.fd)
