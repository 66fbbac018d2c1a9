"""The ETA of a crawl that back-pressure holds (Redis's memory above HA_REDIS_MEMORY_HIGH):
its workers lease nothing new until memory is freed, so there is no countdown, as for a
paused or stopped crawl. Before, ``status`` read ``eta 3m 22s`` beside its back-pressure
line, and the dashboard counted down too."""

from __future__ import annotations

import json

from tests.cli_seed import delayed, scrapy_ha

MARK = {"used": 4_700_000, "max": 5_242_880, "high": 4_718_592, "low": 4_194_304}


def _held(redis_client) -> None:
    """30 pages acked this minute (a pace, so an ETA), and the workers' back-pressure mark."""
    minute = redis_client.time()[0] // 60
    redis_client.hset("ha:{held}:stats:min", f"acked:{minute}", 30)
    since = redis_client.time()[0] * 1000
    redis_client.set("ha:{held}:pressure", json.dumps({**MARK, "since": since}), ex=60)


def test_status_gives_no_eta_while_back_pressure_holds_the_crawl(redis_url, redis_client):
    delayed(redis_url, "held", [("http://a.test/1", 0, "server")])
    _held(redis_client)
    text = scrapy_ha("status", "held", "--redis-url", redis_url).stdout
    doc = json.loads(scrapy_ha("status", "held", "--json", "--redis-url", redis_url).stdout)
    assert "back-pressure  since" in text, text
    assert "eta  none while held back by Redis's memory: 1 left" in text, text
    assert doc["backpressure"] and doc["eta_seconds"] is None, doc
    redis_client.delete("ha:{held}:pressure")  # memory freed: the crawl moves again
    text = scrapy_ha("status", "held", "--redis-url", redis_url).stdout
    assert "none while" not in text and "back-pressure" not in text, text


def test_the_dashboard_gives_no_eta_while_back_pressure_holds_the_crawl(redis_url, redis_client):
    from tests.test_dashboard_api import dashboard
    from tests.test_dashboard_pages import shown

    delayed(redis_url, "held", [("http://a.test/1", 0, "server")])
    _held(redis_client)
    with dashboard(redis_url) as http:
        (crawl,) = http.get("/api/crawls").json()["crawls"]
        assert crawl["backpressure"] and crawl["eta_s"] is None, crawl
        for page in ("/", "/crawls/held"):
            text = shown(http.get(page).text)
            assert "none while held back by Redis's memory" in text.parts, (page, text.parts)
