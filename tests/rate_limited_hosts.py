"""A site that answers 429 (``Retry-After: 60``) at once to every request, on every loopback
address (127.0.9.x are as many hosts): ``python tests/rate_limited_hosts.py`` prints
``LISTENING PORT``; ``/_hits`` gives each host's hit times (seconds since the first hit)."""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from typing import Any

from twisted.internet import reactor
from twisted.web import resource, server

HITS: dict[str, list[float]] = defaultdict(list)
START: list[float] = []


class RateLimited(resource.Resource):
    isLeaf = True

    def render_GET(self, request: Any) -> bytes:  # noqa: N802 (Twisted's name)
        if request.path == b"/_hits":
            return json.dumps(HITS).encode()
        START[:] = START or [time.monotonic()]
        HITS[request.getHeader("host") or ""].append(time.monotonic() - START[0])
        request.setResponseCode(429)
        request.setHeader(b"retry-after", b"60")
        return b"slow down"


def main() -> None:
    site = server.Site(RateLimited())
    port = reactor.listenTCP(0, site, interface="0.0.0.0")  # type: ignore[attr-defined]
    sys.stdout.write(f"LISTENING {port.getHost().port}\n")
    sys.stdout.flush()
    reactor.run()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
