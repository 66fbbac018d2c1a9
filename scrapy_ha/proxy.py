"""The proxy middleware: ``ProxyMiddleware`` rotates a tunnel proxy or a pool on bans.

The documented import path; the implementation is :mod:`scrapy_ha.middlewares.proxy`.
"""

from scrapy_ha.middlewares.proxy import (
    ProxyConfig,
    ProxyMiddleware,
    ProxyPool,
    TunnelProxy,
    parse_pool,
    proxy_id,
    tunnel_status,
)

__all__ = [
    "ProxyConfig",
    "ProxyMiddleware",
    "ProxyPool",
    "TunnelProxy",
    "parse_pool",
    "proxy_id",
    "tunnel_status",
]
