"""What the operator's tools share (the CLI, the dashboard, the exporter): every crawl
under a prefix (:mod:`.crawls`), its numbers (:mod:`.stats`), a sharded crawl as one
(:mod:`.shards`), the operations on a crawl (:mod:`.operations`), and the Prometheus
exporter (:mod:`.metrics`). Workers never import this package."""
