"""``scrapy-ha status`` of a crawl that ``scrapy-ha stop`` stopped. Before, nothing said so:
a stopped continuous crawl read "0 live worker(s)" and "ends only when stopped"."""

from __future__ import annotations

import json

from tests.cli_seed import delayed, scrapy_ha


def _paced(redis_client) -> None:
    """30 pages acked this minute: the crawl has a pace, so an ETA."""
    minute = redis_client.time()[0] // 60
    redis_client.hset("ha:{halted}:stats:min", f"acked:{minute}", 30)


def _status(redis_url: str) -> tuple[str, dict]:
    text = scrapy_ha("status", "halted", "--redis-url", redis_url).stdout
    doc = json.loads(scrapy_ha("status", "halted", "--json", "--redis-url", redis_url).stdout)
    return text, doc


def test_status_says_a_crawl_was_stopped_until_a_worker_resumes_it(redis_url, redis_client):
    delayed(redis_url, "halted", [("http://a.test/1", 3_600_000, "server")])
    _paced(redis_client)
    stopped = scrapy_ha("stop", "halted", "--redis-url", redis_url)
    assert stopped.returncode == 0, stopped.stderr
    at = int(redis_client.get("ha:{halted}:stop"))
    text, doc = _status(redis_url)
    line = next(line for line in text.splitlines() if line.strip().startswith("stopped"))
    assert "(`scrapy-ha stop`): no worker runs it; a worker started now resumes it" in line
    assert doc["stopped_at"] == at
    # nothing moves: no countdown (a QA run: "eta 8m 52s" under the stopped line)
    assert "eta  none while stopped: 1 left" in text, text
    assert doc["eta_seconds"] is None
    # paused too: a worker started now joins it and waits (a QA run: "resumes it")
    assert scrapy_ha("pause", "halted", "--redis-url", redis_url).returncode == 0
    text, _ = _status(redis_url)
    assert "no worker runs it; a worker started now joins it, paused" in text, text
    assert scrapy_ha("resume", "halted", "--redis-url", redis_url).returncode == 0
    redis_client.hset("ha:{halted}:run", "resumed", at + 5)  # a worker started since
    text, doc = _status(redis_url)
    assert "stopped" not in text and doc["stopped_at"] is None
    assert doc["eta_seconds"] is not None  # the delayed entry's due time


def test_a_stop_key_that_is_no_time_reads_as_no_stop(redis_url, redis_client):
    delayed(redis_url, "halted", [("http://a.test/1", 3_600_000, "server")])
    redis_client.set("ha:{halted}:stop", "soon")
    text, doc = _status(redis_url)
    assert "stopped" not in text and doc["stopped_at"] is None


def test_the_dashboard_shows_a_stopped_crawl(redis_url, redis_client):
    from tests.test_dashboard_api import dashboard
    from tests.test_dashboard_pages import shown

    delayed(redis_url, "halted", [("http://a.test/1", 3_600_000, "server")])
    _paced(redis_client)
    assert scrapy_ha("stop", "halted", "--redis-url", redis_url).returncode == 0
    at = int(redis_client.get("ha:{halted}:stop"))
    with dashboard(redis_url) as http:
        (crawl,) = http.get("/api/crawls").json()["crawls"]
        assert crawl["stopped_at"] == at, crawl  # (before: no such key)
        assert crawl["eta_s"] is None, crawl  # (a QA run: a countdown while nothing moves)
        for page in ("/", "/crawls/halted"):
            text = shown(http.get(page).text)
            assert "stopped" in text.parts, (page, text.parts)  # (before: "no worker")
            assert any("a worker started now resumes" in t for t in text.titles)
            assert "none while stopped" in text.parts, (page, text.parts)
        redis_client.hset("ha:{halted}:run", "resumed", at + 5)
        assert "no worker" in shown(http.get("/crawls/halted").text).parts


def test_a_run_begun_after_the_stop_is_no_stopped_crawl(redis_url, redis_client):
    """A review's finding: a worker started after the stop writes ``resumed`` at its second
    look at the operator's keys; one whose run ended before left the crawl "stopped" for
    ever. A run begun (or ended) after the stop says it was not."""
    delayed(redis_url, "halted", [("http://a.test/1", 3_600_000, "server")])
    assert scrapy_ha("stop", "halted", "--redis-url", redis_url).returncode == 0
    at = int(redis_client.get("ha:{halted}:stop"))
    redis_client.hset("ha:{halted}:run", mapping={"n": 2, "started": at + 3, "open": 1})
    text, doc = _status(redis_url)
    assert "stopped  at" not in text and doc["stopped_at"] is None
    redis_client.hset("ha:{halted}:run", mapping={"started": at - 9, "ended": at + 9})
    assert _status(redis_url)[1]["stopped_at"] is None


def test_the_dashboard_shows_a_crawl_held_back_by_redis_memory(redis_url, redis_client):
    """A QA finding: ``status`` showed the back-pressure line while the dashboard's crawl
    page read "running" and the API had no field for it."""
    from tests.test_dashboard_api import dashboard
    from tests.test_dashboard_pages import shown

    delayed(redis_url, "halted", [("http://a.test/1", 3_600_000, "server")])
    redis_client.set("ha:{halted}:pressure", '{"used": 9, "max": 10}', ex=60)
    with dashboard(redis_url) as http:
        (crawl,) = http.get("/api/crawls").json()["crawls"]
        assert crawl["backpressure"] is True, crawl  # (before: no such key)
        text = shown(http.get("/crawls/halted").text)
        assert "held back: Redis memory" in text.parts, text.parts


def test_status_of_back_pressure_without_maxmemory_says_so():
    """A QA finding: marks in bytes on a Redis without maxmemory read "Redis uses 3.5 MB of
    0.0 MB"."""
    from scrapy_ha.cli.status import _pressure_lines

    mark = {"used": 3 * 2**20, "max": 0, "high": 2**20, "low": 2**19, "since": 0}
    (line,) = _pressure_lines(mark)
    assert "Redis uses 3.0 MB (no maxmemory) (HA_REDIS_MEMORY_HIGH 1.0 MB)" in line, line
    (line,) = _pressure_lines({**mark, "max": 4 * 2**20})
    assert "Redis uses 3.0 MB of 4.0 MB (HA_REDIS_MEMORY_HIGH 1.0 MB)" in line, line


def test_back_pressure_on_a_redis_that_evicts_does_not_say_nothing_is_lost(redis_url, redis_client):
    """A QA run: with maxmemory-policy allkeys-lru, Redis evicted 8,767 keys under
    back-pressure while the status's back-pressure line said "nothing is lost" (its redis
    line named the policy)."""
    from tests.cli_seed import scrapy_ha

    done = scrapy_ha("push", "evicts", "http://a.test/1", "--create", "--redis-url", redis_url)
    assert done.returncode == 0, done.stderr
    mark = '{"used": 9000000, "max": 10000000, "high": 8000000, "low": 7000000, "since": 1}'
    redis_client.set("ha:{evicts}:pressure", mark, ex=60)
    used = redis_client.info("memory")["used_memory"]
    lines = {}
    for policy in ("noeviction", "allkeys-lru"):
        redis_client.config_set("maxmemory-policy", policy)
        redis_client.config_set("maxmemory", used * 4)
        try:
            shown = scrapy_ha("status", "evicts", "--redis-url", redis_url)
        finally:
            redis_client.config_set("maxmemory", 0)
            redis_client.config_set("maxmemory-policy", "noeviction")
        assert shown.returncode == 0, shown.stderr
        (lines[policy],) = [ln for ln in shown.stdout.splitlines() if "back-pressure" in ln]
    assert lines["noeviction"].endswith("; nothing is lost"), lines
    assert lines["allkeys-lru"].endswith("; Redis deletes keys (redis, below)"), lines
