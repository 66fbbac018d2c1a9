"""`scrapy-ha report`: a crawl's summary over a window, after a real crawl."""

from __future__ import annotations

import asyncio
import json

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.cli.grammar import parse_window
from tests.spiders import FaultSpider
from tests.test_dlq import PATHS, cli
from tests.test_retry_crawl import FAST_RETRIES

#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


@deferred_f_from_coro_f
async def test_the_report_sums_up_the_window(redis_url, site):
    crawler = get_crawler(FaultSpider, {**FAST_RETRIES, "REDIS_URL": redis_url})
    await crawler.crawl_async(base_url=site.url, paths=PATHS)

    result = cli(redis_url, "report", "faults", "--since", "24h", "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["spider"] == "faults" and report["window_s"] == 86400
    assert report["states"]["dead"] == 3 and report["states"]["pending"] == 0
    # done and retried from the crawl-wide counters, dead from the dead-letter queue's times
    assert report["window"] == {"enqueued": 4, "acked": 1, "retried": 2, "dead": 3}
    assert report["retry_success_rate"] == 0.0  # the one request retried ended dead
    assert report["totals"]["dead:gone"] == 2
    assert report["dead_by_class"] == {"gone": 2, "server": 1}
    assert report["top_domains"] == [["127.0.0.1", 3]]
    assert sorted(r for r, _ in report["top_reasons"]) == ["HTTP 404", "HTTP 410", "HTTP 503"]

    text = cli(redis_url, "report", "faults").stdout
    assert "in window:  enqueued 4, acked 1, retried 2, dead 3" in text
    assert "success rate 0%" in text
    assert "dead by class:  gone 2, server 1" in text
    assert "dead by domain: 127.0.0.1 3" in text  # (was "top domains", unsaid of what)
    markdown = cli(redis_url, "report", "faults", "--format", "markdown").stdout
    assert "## scrapy-ha report: faults" in markdown and "| gone | 2 |" in markdown

    await asyncio.sleep(2.5)  # the dead letters are now older than a 2-second window
    later = json.loads(
        cli(redis_url, "report", "faults", "--since", "2s", "--format", "json").stdout
    )
    assert later["window"]["dead"] == 0 and later["dead_by_class"] == {}
    assert later["states"]["dead"] == 3


@deferred_f_from_coro_f
async def test_an_event_the_crawl_never_had_in_the_window_is_0_not_unknown(
    redis_url, redis_client, site
):
    """A crawl of 404s alone read "acked n/a, retried n/a" over an hour: n/a is for a
    window longer than the day the per-minute counters are kept, not for none. A dead
    letter timed in the future (by hand) is not in a window that ends now."""
    crawler = get_crawler(FaultSpider, {**FAST_RETRIES, "REDIS_URL": redis_url})
    await crawler.crawl_async(base_url=site.url, paths=("/status/404", "/status/410"))
    redis_client.zadd("ha:{faults}:dead", {"future": 9_999_999_999_999})
    result = cli(redis_url, "report", "faults", "--since", "1h", "--format", "json")
    assert result.returncode == 0, result.stderr
    window = json.loads(result.stdout)["window"]
    assert window == {"enqueued": 2, "acked": 0, "retried": 0, "dead": 2}, window


def test_a_share_short_of_the_whole_never_reads_100_percent():
    """2 dead of 30,000 retried read "retry success rate 100%"; 1 of 30,000 done, 0%."""
    from scrapy_ha.dashboard._pages import percent, rate  # noqa: PLC0415
    from scrapy_ha.ops.display import share_text  # noqa: PLC0415

    assert share_text(29_998 / 30_000) == ">99.9%"
    assert share_text(1 / 30_000) == "<0.1%"
    assert (share_text(1.0), share_text(0.0), share_text(None)) == ("100%", "0%", "n/a")
    assert share_text(0.617) == "61.7%" and share_text(0.9994) == "99.9%"
    assert rate(29_998 / 30_000) == ">99.9 %" and percent(1, 30_000) == "<0.1 %"
    assert percent(20, 40) == "50.0 %" and rate(None) == "–" and percent(1, 0) == "–"


def test_a_bad_window_is_named(redis_url):
    result = cli(redis_url, "report", "faults", "--since", "yesterday")
    assert result.returncode == 2
    assert "--since 'yesterday': write a duration of a second or more, such as 24h" in (
        result.stderr
    )
    # (under a second was a window of 0 s, which reported the current minute's events)
    for short in ("0", "0.1", "0.5s"):
        result = cli(redis_url, "report", "faults", "--since", short)
        assert result.returncode == 2, (short, result.stdout)
        assert f"--since {short!r}: write a duration of a second or more" in result.stderr
    # a minus sign (a window "5 minutes back" written -5m) was read as an option by
    # argparse: "expected one argument", which named nothing wrong with the value
    for command in (("report", "faults"), ("dlq", "list", "faults")):
        result = cli(redis_url, *command, "--since", "-5m")
        assert result.returncode == 2, (command, result.stdout)
        assert "--since '-5m':" in result.stderr, (command, result.stderr)
        assert "expected one argument" not in result.stderr


def test_windows():
    assert [parse_window(w) for w in ("24h", "90m", "7d", "30s", "3600")] == [
        86400,
        5400,
        604800,
        30,
        3600,
    ]


def test_the_window_sums_only_its_own_minutes(redis_url, redis_client):
    """The per-minute counters of a 1-hour window: 30 minutes ago counts, 2 hours ago not
    (a window of seconds, as above, falls inside the current minute and cannot tell)."""
    seconds, _ = redis_client.time()
    minute = seconds // 60
    redis_client.hset("ha:{shop}:stats", mapping={"enqueued": 20, "acked": 12})
    redis_client.hset(
        "ha:{shop}:stats:min",
        mapping={
            f"acked:{minute - 30}": 5,
            f"acked:{minute - 120}": 7,
            f"enqueued:{minute}": 3,
            f"enqueued:{minute - 61}": 17,
            f"retried:{minute - 59}": 2,
        },
    )
    report = json.loads(
        cli(redis_url, "report", "shop", "--since", "1h", "--format", "json").stdout
    )
    assert report["window"] == {"enqueued": 3, "acked": 5, "retried": 2, "dead": 0}


def test_dead_letters_and_workers_written_by_hand_do_not_break_the_listings(
    redis_url, redis_client
):
    """A dead letter timed ``inf`` or named by bytes that are not UTF-8 (written by hand)
    made ``dlq list``, ``dlq export`` and ``report`` fail with a traceback: one bad entry
    hid every other."""
    from tests.test_dashboard_api import seed_dead

    seed_dead(redis_client, 3, spider="shop")
    redis_client.zadd("ha:{shop}:dead", {"903": float("inf"), b"\xff\xfe": 1, "904": 1e300})
    redis_client.zadd("ha:{shop}:seen", {b"\xff": 2**41, "w-inf": float("inf"), "w-far": 1e20})
    listed = cli(redis_url, "dlq", "list", "shop")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[-1].startswith("6 entries listed"), listed.stdout
    assert "\\xff\\xfe" in listed.stdout
    exported = cli(redis_url, "dlq", "export", "shop")
    assert exported.returncode == 0 and len(exported.stdout.splitlines()) == 6, exported.stderr
    report = cli(redis_url, "report", "shop", "--since", "7d", "--format", "json")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["states"]["dead"] == 6
    # a time of `inf` or to come is no heartbeat of the window (it read "last seen 9999-...")
    assert json.loads(report.stdout)["workers_seen"] == [], report.stdout  # (all 3 to come)
    from tests.test_dashboard_api import dashboard

    with dashboard(redis_url) as http:
        page = http.get("/api/crawls/shop/dead", params={"size": 50})
        assert page.status_code == 200 and len(page.json()["entries"]) == 6, page.text


def test_a_reason_on_several_lines_is_one_line_and_one_row(redis_url, redis_client):
    """A QA run: a dead letter's reason with a newline split its row of ``report --format
    markdown`` and its line of the text; its HTML went into the table as it was."""
    from tests.cli_seed import dead_letters

    dead_letters(redis_url, "faults", [("http://a.example/gone", "gone", 404)])
    (entry_id, raw) = redis_client.hgetall("ha:{faults}:dead_info").popitem()
    info = json.loads(raw)
    info["reason"] = "a|b <img src=x onerror=alert(1)>\nline2"
    redis_client.hset("ha:{faults}:dead_info", entry_id, json.dumps(info))
    text = cli(redis_url, "report", "faults").stdout
    (line,) = [x for x in text.splitlines() if x.startswith("dead by reason:")]
    assert line == "dead by reason: a|b <img src=x onerror=alert(1)> line2 (1)", text
    markdown = cli(redis_url, "report", "faults", "--format", "markdown").stdout
    assert "| a/b &lt;img src=x onerror=alert(1)&gt; line2 | 1 |" in markdown, markdown
    assert "<img" not in markdown


def test_the_minute_the_window_begins_in_counts_for_its_part_inside(redis_url, redis_client):
    """``--since 1m`` at 40 s into a minute summed the last minute's bucket whole (100 s of
    events for a window of 60: 491 acks reported where a crawl made 264), and ``--since
    10s`` a whole minute's. A bucket of a minute to come (by hand) is in no window."""
    import time  # noqa: PLC0415

    seconds, micros = redis_client.time()
    if seconds % 60 > 50:  # (the window's minute must not change while the command runs)
        time.sleep(61 - seconds % 60)
        seconds, micros = redis_client.time()
    minute = seconds // 60
    before = (seconds * 1000 + micros // 1000) % 60_000  # ms into the current minute
    redis_client.hset("ha:{shop}:stats", mapping={"acked": 6_107})
    redis_client.hset(
        "ha:{shop}:stats:min",
        mapping={
            f"acked:{minute - 2}": 7,  # before the window
            f"acked:{minute - 1}": 6_000,  # the window begins in it
            f"acked:{minute + 5}": 100,  # to come
        },
    )
    report = json.loads(
        cli(redis_url, "report", "shop", "--since", "1m", "--format", "json").stdout
    )
    seconds, micros = redis_client.time()
    after = (seconds * 1000 + micros // 1000) % 60_000
    assert seconds // 60 == minute
    # 6,000 spread evenly: the window holds the part of that minute after `into` ms
    acked = report["window"]["acked"]
    assert 6_000 - after // 10 - 1 <= acked <= 6_000 - before // 10 + 1, (before, after, acked)


def test_a_domain_of_a_crawled_link_is_one_cell_of_the_markdown_table(redis_url):
    """A crawled page links to a host Scrapy keeps as it is (``a|b.example``,
    ``c<!--.example``): its row of ``report --format markdown`` split at the ``|``, and the
    ``<!--`` opened an HTML comment that hid the rest of the report wherever the markdown
    is rendered. Domains and classes are cells as reasons are."""
    from tests.cli_seed import dead_letters

    urls = ["http://a|b.example/p", "http://c<!--.example/p"]
    dead_letters(redis_url, "hosts", [(url, "gone", 404) for url in urls])
    markdown = cli(redis_url, "report", "hosts", "--format", "markdown").stdout
    assert "| a/b.example | 1 |" in markdown, markdown
    assert "| c&lt;!--.example | 1 |" in markdown, markdown
    assert "<!--" not in markdown, markdown
