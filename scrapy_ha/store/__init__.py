"""A crawl's data in Redis, for every process that reads or writes it (workers, the CLI,
the dashboard): where the Redis is (:mod:`.url`, :mod:`.connection`), the Lua scripts
(``lua/``, :mod:`.scripts`) and their typed wrappers (:mod:`.wire`, :mod:`.queue`), sharded
crawls (:mod:`.shards`), the server's health (:mod:`.health`) and the middlewares' state
(:mod:`.state`). Nothing here knows Scrapy's engine."""
