"""Write each item as one JSON line to ITEMS_FILE (one file per worker)."""

from __future__ import annotations

import json
from typing import Any

from itemadapter import ItemAdapter


class JsonLinesPipeline:
    def __init__(self, path: str) -> None:
        self.path = path
        self.file: Any = None

    @classmethod
    def from_crawler(cls, crawler: Any) -> JsonLinesPipeline:
        return cls(crawler.settings.get("ITEMS_FILE") or "items.jl")

    def open_spider(self) -> None:
        self.file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def close_spider(self) -> None:
        self.file.close()

    def process_item(self, item: Any) -> Any:
        line = json.dumps(ItemAdapter(item).asdict(), default=str, sort_keys=True)
        self.file.write(line + "\n")
        self.file.flush()
        return item
