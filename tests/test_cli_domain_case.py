"""A host name is case-insensitive: ``--domain SHOP.Example`` picks what ``shop.example``
picks, in ``dlq`` and ``delayed`` as in the dashboard's filter (which gave 24,000 dead
letters where ``dlq list`` said the queue was empty for that filter)."""

from __future__ import annotations

from tests.cli_seed import dead_letters, delayed, scrapy_ha
from tests.test_dashboard_api import dashboard

SPELLED = "SHOP.Example"


def test_a_domain_in_capitals_picks_the_same_entries_as_the_dashboard(redis_url):
    dead_letters(
        redis_url,
        "books",
        [("http://shop.example/1", "gone", 404), ("http://other.example/2", "gone", 404)],
    )
    delayed(redis_url, "books", [("http://shop.example/3", 3_600_000, "server")])
    with dashboard(redis_url) as http:
        shown = http.get("/api/crawls/books/dead", params={"domain": SPELLED}).json()
    assert [e["url"] for e in shown["entries"]] == ["http://shop.example/1"]
    listed = scrapy_ha("dlq", "list", "books", "--domain", SPELLED, "--redis-url", redis_url)
    assert listed.stdout.splitlines()[-1] == "1 entry listed (gone 1)"
    waiting = scrapy_ha("delayed", "list", "books", "--domain", SPELLED, "--redis-url", redis_url)
    assert waiting.stdout.splitlines()[-1] == "1 delayed request listed (1 retry)"
