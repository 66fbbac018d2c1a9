"""A downloader middleware of the kind projects write: it times each request."""

from __future__ import annotations

from datetime import datetime
from typing import Any


class SentAtMiddleware:
    """Stamps ``meta["sent_at"]`` with the time the request was sent (spiders that ask for it)."""

    def process_request(self, request: Any) -> None:
        if request.meta.get("want_sent_at"):
            request.meta["sent_at"] = datetime.now()
