"""The downloader and spider middlewares (retries, proxies, checkpoints, cookies, user
agents, parent leases). Users name them by their public paths (``scrapy_ha.retry``,
``scrapy_ha.proxy``, ...); they reach the crawl's scheduler through :mod:`.registry`
only."""
