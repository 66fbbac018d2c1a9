# Scrapy settings for shop project
#
# As `scrapy startproject shop` writes them (comments trimmed), plus the pipeline and the
# middleware of the project, and at the bottom the README's two lines of scrapy-ha, which the
# realworld test switches on with SHOP_HA=1.

import os

BOT_NAME = "shop"

SPIDER_MODULES = ["shop.spiders"]
NEWSPIDER_MODULE = "shop.spiders"

ADDONS = {}

# Obey robots.txt rules
ROBOTSTXT_OBEY = True

# Concurrency and throttling settings
# CONCURRENT_REQUESTS = 16
CONCURRENT_REQUESTS_PER_DOMAIN = 1
DOWNLOAD_DELAY = 1  # the test passes -s DOWNLOAD_DELAY=0: a loopback site needs no politeness

DOWNLOADER_MIDDLEWARES = {
    "shop.middlewares.SentAtMiddleware": 543,
}

ITEM_PIPELINES = {
    "shop.pipelines.JsonLinesPipeline": 300,
}

# Set settings whose default value is deprecated to a future-proof value
FEED_EXPORT_ENCODING = "utf-8"

# scrapy-ha (README, "Quick start")
if os.environ.get("SHOP_HA"):
    ADDONS = {"scrapy_ha.Addon": 0}
    REDIS_URL = os.environ["REDIS_URL"]
    # test plumbing: the two-worker run holds its start until both workers joined
    EXTENSIONS = {"shop.extensions.WaitForWorkers": 0}
