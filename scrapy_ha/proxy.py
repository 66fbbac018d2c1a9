"""The proxy middleware: ``ProxyMiddleware`` rotates a tunnel proxy or a pool on bans.

The documented import path; the implementation is in :mod:`scrapy_ha.middlewares.proxy`.
"""

from scrapy_ha.config.middlewares import ProxyConfig
from scrapy_ha.middlewares.proxy import ProxyMiddleware, tunnel_status
from scrapy_ha.middlewares.proxy_sources import ProxyPool, TunnelProxy, parse_pool, proxy_id

__all__ = [
    "ProxyConfig",
    "ProxyMiddleware",
    "ProxyPool",
    "TunnelProxy",
    "parse_pool",
    "proxy_id",
    "tunnel_status",
]
