"""Settings of the example project: a plain Scrapy project plus the scrapy-ha add-on."""

import os

BOT_NAME = "catalogue"
SPIDER_MODULES = ["catalogue.spiders"]
NEWSPIDER_MODULE = "catalogue.spiders"

# The one line that makes the crawl highly available (the add-on wires the rest).
ADDONS = {"scrapy_ha.Addon": 0}

# Every worker of the crawl points at the same Redis.
REDIS_URL = "redis://127.0.0.1:6379/0"

# Each pagination chain saves checkpoints (see the spider). A chain that finished is skipped
# by every later run for HA_CHECKPOINT_TTL (7 days), SCHEDULER_PERSIST or not: a second
# `scrapy crawl` crawls nothing (an INFO line per task says so). To crawl it all again:
# `scrapy-ha checkpoints reset catalogue --all --yes`, or -s HA_CHECKPOINT_RERUN=True.
HA_CHECKPOINTS = True

# A tunnel proxy, from the environment (HA_PROXY_MODE=tunnel and
# HA_PROXY_URL=http://user:password@host:port) so that the password stays out of the
# project; a ban puts a new session in the user name (in the demo proxy's format: give your
# provider's). Without them requests go direct.
if os.environ.get("HA_PROXY_MODE"):
    HA_PROXY_SESSION_TEMPLATE = "{user}-session-{session}"

# For the demo site on loopback, made to be hammered. For a real site keep Scrapy's defaults
# (ROBOTSTXT_OBEY = True, CONCURRENT_REQUESTS_PER_DOMAIN = 8): they hold in each worker, so
# N workers send N times as much; HA_DOMAIN_CONCURRENCY and HA_DOMAIN_RATE hold for the
# whole crawl (docs/scaling.md).
ROBOTSTXT_OBEY = False
CONCURRENT_REQUESTS = 32
CONCURRENT_REQUESTS_PER_DOMAIN = 32
LOG_LEVEL = "INFO"

# Items are appended, one JSON line each, to ITEMS_FILE (if set).
ITEM_PIPELINES = {"catalogue.pipelines.AppendJsonLinesPipeline": 300}
