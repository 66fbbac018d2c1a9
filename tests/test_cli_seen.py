"""``scrapy-ha seen check`` and ``seen forget``: what the crawl's dupefilter holds of a URL,
and letting URLs, domains and patterns be crawled again, against crawls of the demo site."""

from __future__ import annotations

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from tests.cli_seed import scrapy_ha
from tests.spiders import CatalogueSpider

#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


def settings(redis_url: str, **extra) -> dict:
    return {
        **extra,
        "ADDONS": {"scrapy_ha.Addon": 0},
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.3,
        "SCHEDULER_PERSIST": True,
        "LOG_LEVEL": "INFO",
    }


async def crawl(redis_url: str, site, **extra) -> list[int]:
    crawler = get_crawler(CatalogueSpider, settings(redis_url, **extra))
    await crawler.crawl_async(base_url=site.url)
    return sorted(item["id"] for item in crawler.spider.items)


def seen(redis_url: str, *args: str):
    return scrapy_ha("seen", *args, "--redis-url", redis_url)


@deferred_f_from_coro_f
async def test_check_then_forget_one_url(redis_url, site):
    every = await crawl(redis_url, site)
    item = f"{site.url}/item/{every[0]}"
    checked = seen(redis_url, "check", "catalogue", item, f"{site.url}/nowhere")
    assert checked.returncode == 1, checked.stderr  # one of the two is not seen
    assert checked.stdout.splitlines() == [
        f"{item}: seen (kept for ever)",
        f"{site.url}/nowhere: not seen",
    ]
    dry = seen(redis_url, "forget", "catalogue", item, "--dry-run")
    assert dry.returncode == 0 and "would forget 1 item of catalogue" in dry.stdout
    assert seen(redis_url, "check", "catalogue", item).returncode == 0  # nothing changed
    refused = seen(redis_url, "forget", "catalogue", item)  # stdin is no terminal
    assert refused.returncode == 1 and "without --yes" in refused.stderr
    done = seen(redis_url, "forget", "catalogue", item, "--yes")
    assert done.returncode == 0, done.stderr
    assert "forgot 1 URL (1 fingerprint(s) removed)" in done.stdout
    assert seen(redis_url, "check", "catalogue", item).stdout == f"{item}: not seen\n"
    assert await crawl(redis_url, site) == [every[0]]  # linked again: crawled again, alone


@deferred_f_from_coro_f
async def test_forget_a_domain_and_a_pattern(redis_url, site):
    every = await crawl(redis_url, site)
    pattern = f"{site.url}/item/?"  # items 1 to 9, linked from the start page
    done = seen(redis_url, "forget", "catalogue", "--pattern", pattern, "--yes")
    assert done.returncode == 0, done.stderr
    checked = seen(redis_url, "check", "catalogue", f"{site.url}/item/2")
    assert checked.returncode == 1
    assert "a forget rule matches it" in checked.stdout
    assert await crawl(redis_url, site) == list(range(1, 10))
    assert await crawl(redis_url, site) == []  # forgotten once: seen again since
    done = seen(redis_url, "forget", "catalogue", "--domain", "127.0.0.1", "--yes")
    assert done.returncode == 0, done.stderr
    assert await crawl(redis_url, site) == every  # the list pages too: every item again


@deferred_f_from_coro_f
async def test_a_domain_rule_of_an_address_matches_that_address_alone(redis_url, site):
    """A rule ``0.0.1`` (or ``1``) forgot every URL of 127.0.0.1, taken for its subdomain,
    and the confirmation of ``--domain 127.0.0.1`` promised its subdomains."""
    every = await crawl(redis_url, site)
    for part in ("0.0.1", "1"):
        done = seen(redis_url, "forget", "catalogue", "--domain", part, "--yes")
        assert done.returncode == 0, done.stderr
    assert await crawl(redis_url, site) == []  # the site's host is 127.0.0.1: nothing new
    shown = seen(redis_url, "forget", "catalogue", "--domain", "127.0.0.1", "--dry-run")
    assert "every URL of 127.0.0.1\n" in shown.stdout and "subdomains" not in shown.stdout
    done = seen(redis_url, "forget", "catalogue", "--domain", "127.0.0.1", "--yes")
    assert await crawl(redis_url, site) == every


@deferred_f_from_coro_f
async def test_a_bloom_filter_forgets_by_rules_only(redis_url, site):
    bloom = {"HA_DUPEFILTER": "bloom"}
    every = await crawl(redis_url, site, **bloom)
    item = f"{site.url}/item/{every[0]}"
    checked = seen(redis_url, "check", "catalogue", item)
    assert checked.returncode == 2 and "a Bloom filter is not read URL by URL" in checked.stderr
    refused = seen(redis_url, "forget", "catalogue", item, "--yes")
    assert refused.returncode == 2 and "give it as --pattern" in refused.stderr
    done = seen(redis_url, "forget", "catalogue", "--pattern", f"{site.url}/item/?", "--yes")
    assert done.returncode == 0, done.stderr
    assert await crawl(redis_url, site, **bloom) == list(range(1, 10))  # a rule: new again


def test_a_url_or_domain_that_can_never_match_is_a_usage_error(redis_url):
    """A malformed URL was a traceback with exit code 1 (which `seen check` gives a URL not
    seen); a --domain with a scheme or a port was a rule that forgot nothing, silently."""
    from tests.cli_seed import dead_letters

    dead_letters(redis_url, "catalogue", [("http://a.test/1", "gone", 404)])  # a crawl
    for args in (
        ("check", "catalogue", "notaurl"),
        ("check", "catalogue", "http://[bad"),
        ("forget", "catalogue", "notaurl", "--yes"),
        ("forget", "catalogue", "--domain", "http://shop.example/", "--yes"),
        ("forget", "catalogue", "--domain", "127.0.0.1:6413", "--yes"),
        ("forget", "catalogue", "--domain", "", "--yes"),
        ("forget", "catalogue", "--domain", "*.shop.example", "--yes"),
        ("forget", "catalogue", "--domain", ".shop.example", "--yes"),
        ("forget", "catalogue", "--domain", "user@shop.example", "--yes"),
        # a rule matching no URL, kept for the crawl's life (a QA run: stored, exit 0)
        ("forget", "catalogue", "--pattern", "", "--yes"),
        ("forget", "catalogue", "--pattern", "   ", "--yes"),
        ("forget", "catalogue", "--pattern", "shop.example/p/1", "--yes"),
    ):
        done = seen(redis_url, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.startswith("error: ") and "Traceback" not in done.stderr, args
    ok = seen(redis_url, "forget", "catalogue", "--domain", "Bücher.Example.", "--dry-run")
    assert ok.returncode == 0, ok.stderr  # as workers see its URLs' host
    assert "every URL of xn--bcher-kva.example and its subdomains" in ok.stdout
    ok = seen(redis_url, "forget", "catalogue", "--pattern", "*shop.example/p/*", "--dry-run")
    assert ok.returncode == 0 and "every URL matching *shop.example/p/*" in ok.stdout
