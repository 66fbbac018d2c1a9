"""``scrapy_ha.revisit``: conditional revisits and change detection.

``RevisitMiddleware`` (the add-on wires it at 580 among the downloader middlewares) sends a
revisited request's validators and tells a changed page from an unchanged one;
``NotModified`` is what the errback of a revisited request gets for an unchanged page (its
callback is not called). See docs/reference.md, "Revisits".
"""

from __future__ import annotations

from scrapy_ha.middlewares.revisit import NotModified, RevisitMiddleware, signature_of

__all__ = ["NotModified", "RevisitMiddleware", "signature_of"]
