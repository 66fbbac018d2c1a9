"""``scrapy-ha delayed list`` / ``retry-now``: retries waiting for their time, shown with
local due times, made due at once and then promoted by a worker's own sync."""

from __future__ import annotations

import re
import time

from scrapy_ha.keys import Keys
from tests.cli_seed import delayed, lease_all, scrapy_ha

HOUR = 3600_000
ROWS = [
    ("http://a.example/1", HOUR, "server"),
    ("http://b.example/2", 2 * HOUR, "network"),
    ("http://a.example/3", 3 * HOUR, "server"),
]


def test_delayed_list_shows_due_times_class_and_attempts(redis_url):
    delayed(redis_url, "books", ROWS)
    out = scrapy_ha("delayed", "list", "books", "--redis-url", redis_url).stdout.splitlines()
    assert out[0].split() == ["ID", "DUE", "IN", "CLASS", "TRIES", "URL"]
    assert [line.split()[-1] for line in out[1:-1]] == [u for u, _, _ in ROWS]
    due = time.localtime(time.time() + 3600)
    assert time.strftime("%Y-%m-%d %H:", due) in out[1]
    assert re.fullmatch(r"5\dm \d\ds", " ".join(out[1].split()[3:5]))  # due in an hour
    assert out[1].split()[5:7] == ["server", "2"]
    assert out[-1] == "3 delayed requests listed (3 retries)"
    only = scrapy_ha("delayed", "list", "books", "--class", "network", "--redis-url", redis_url)
    assert only.stdout.splitlines()[1].split()[-1] == "http://b.example/2"


def test_retry_now_makes_them_due_and_a_worker_sync_promotes_them(redis_url, redis_client):
    ids = delayed(redis_url, "books", ROWS)
    cli = ("delayed", "retry-now", "books", "--redis-url", redis_url)
    refused = scrapy_ha(*cli)
    assert refused.returncode == 1 and "--all" in refused.stderr
    dry = scrapy_ha(*cli, "--domain", "a.example", "--dry-run")
    assert dry.stdout.splitlines()[0] == (
        "would retry now 2 delayed requests of books (dry run: nothing changed)"
    )
    assert lease_all(redis_url, "books") == []  # nothing due yet
    done = scrapy_ha(*cli, "--domain", "a.example", "--yes")
    assert done.stdout.strip() == (
        "made 2 of 2 delayed requests of books due now: workers take them at their next sync"
    )
    assert sorted(lease_all(redis_url, "books")) == ["http://a.example/1", "http://a.example/3"]
    by_id = scrapy_ha(*cli, "999998", ids[1], "999999", "--yes")  # mistyped ids: each said
    assert by_id.stdout.startswith("made 1 of 1 delayed request of books due now")
    assert by_id.returncode == 1 and "no delayed request 999998, 999999 in books" in by_id.stderr
    assert lease_all(redis_url, "books") == ["http://b.example/2"]
    assert redis_client.zcard("ha:{books}:delayed") == 0


def test_delayed_list_counts_revisits_and_held_requests_apart_from_retries(redis_url, redis_client):
    """The listing's last line said "3 delayed retries" of revisits too."""
    ids = delayed(redis_url, "books", ROWS)
    held = Keys("ha", "books").held
    redis_client.hset(held, mapping={ids[0]: "revisit a.example", ids[1]: "gate b.example"})
    out = scrapy_ha("delayed", "list", "books", "--redis-url", redis_url).stdout.splitlines()
    assert [line.split()[5] for line in out[1:-1]] == ["revisit", "gate", "server"]
    assert out[-1] == "3 delayed requests listed (1 retry, 1 revisit, 1 held by a gate)"


def test_a_delayed_entry_timed_inf_by_hand_is_shown_not_a_crash(redis_url, redis_client):
    """``ZADD ha:{books}:delayed inf <id>``: ``status`` failed (int of b'inf'), ``delayed
    list`` with OverflowError, the dashboard's delayed table with a 500."""
    from tests.test_dashboard_api import dashboard

    ids = delayed(redis_url, "books", ROWS)
    redis_client.zadd("ha:{books}:delayed", {ids[0]: float("inf")})
    status = scrapy_ha("status", "books", "--redis-url", redis_url)
    assert status.returncode == 0, status.stderr
    listed = scrapy_ha("delayed", "list", "books", "--redis-url", redis_url)
    assert listed.returncode == 0, listed.stderr
    assert "9999-12-3" in listed.stdout and "3 delayed requests listed" in listed.stdout
    with dashboard(redis_url) as http:
        assert http.get("/api/crawls/books/delayed").status_code == 200
        assert http.get("/api/crawls/books").status_code == 200


def test_a_delayed_entry_due_at_0_keeps_the_listings_columns(redis_url, redis_client):
    """A due time of 0 (written by hand) left the DUE column empty: every column after it
    moved left (a QA run)."""
    ids = delayed(redis_url, "books", ROWS)
    redis_client.zadd("ha:{books}:delayed", {ids[1]: 0})
    out = scrapy_ha("delayed", "list", "books", "--redis-url", redis_url).stdout.splitlines()
    row = out[1].split()
    assert row[:3] == [ids[1], "-", "due"] and row[3:5] == ["network", "2"]
    assert out[1].index("network") == out[2].index("server")  # the columns after it, aligned


def test_counts_in_the_lines_are_written_as_status_writes_them(redis_url):
    """``status`` said "delayed 1,200: 1200 retries": the count in words had no
    thousands separator (every line that names a count in words: ``common.plural``)."""
    rows = [(f"http://a.example/{n}", HOUR, "server") for n in range(1200)]
    delayed(redis_url, "many", rows)
    out = scrapy_ha("status", "many", "--redis-url", redis_url).stdout
    assert re.search(r"delayed +1,200: 1,200 retries;", out), out
    listed = scrapy_ha("delayed", "list", "many", "--redis-url", redis_url).stdout
    assert listed.splitlines()[-1] == "1,200 delayed requests listed (1,200 retries)"
