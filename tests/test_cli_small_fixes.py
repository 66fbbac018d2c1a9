"""Small things the ``scrapy-ha`` commands say and check, run as users run them (the console
script in a subprocess, a real redis-server): ``flush`` says it keeps the checkpoints, a
database index Redis does not have is named, numeric options are checked and named."""

from __future__ import annotations

import pytest
import redis

from tests.test_cli import scrapy_ha
from tests.test_dashboard_api import seed_dead


def test_flush_says_the_checkpoints_are_kept_and_how_to_delete_them(redis_url):
    client = redis.Redis.from_url(redis_url)
    assert (
        scrapy_ha(
            "--redis-url", redis_url, "push", "books", "--create", "https://a.example/"
        ).returncode
        == 0
    )
    assert "but its checkpoints" in scrapy_ha("flush", "--help").stdout.replace("\n", " ")
    dry = scrapy_ha("--redis-url", redis_url, "flush", "books", "--dry-run")
    assert dry.stdout.startswith("would flush every key of books but its checkpoints"), dry.stdout
    client.set("ha:{books}:cp:cat1", '{"page": 7}')
    done = scrapy_ha("--redis-url", redis_url, "flush", "books", "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "flushed books; its checkpoints are kept (a new crawl resumes its tasks from them): "
        "`scrapy-ha checkpoints reset books --all` deletes them"
    )
    assert client.keys("*") == [b"ha:{books}:cp:cat1"]
    client.close()


def test_a_flush_without_its_prompt_says_the_items_it_deleted(redis_url):
    """``flush --yes`` deleted items no sink had consumed, silently: only ``--dry-run`` or
    the prompt's list named them."""
    client = redis.Redis.from_url(redis_url)
    for n in range(3):
        client.xadd("ha:{books}:items", {"item": str(n)})
    client.xgroup_create("ha:{books}:items", "sink", id="0")
    for n in range(2):
        client.xadd("ha:{books}:items_aside", {"item": str(n), "group": "sink"})
    done = scrapy_ha("--redis-url", redis_url, "flush", "books", "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "flushed books (items not consumed by every sink yet (lost to them): 3; items set "
        "aside by a sink (`items --aside`): 2)"
    ), done.stdout
    assert client.keys("*") == []
    client.close()


def test_a_database_redis_does_not_have_is_named_not_a_traceback(redis_url):
    base = redis_url.rsplit("/", 1)[0]
    done = scrapy_ha("--redis-url", f"{base}/99", "status", "books")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(
        f"error: Redis at {base}/99 refused the connection to database 99 (ResponseError: "
        "DB index is out of range): give a database it has"
    ), done.stderr
    assert "Traceback" not in done.stderr


def test_a_sentinel_url_at_a_redis_itself_says_so(redis_url):
    """Before: "refused the connection to database 0 ... give a database it has"."""
    sentinel = redis_url.replace("redis://", "redis+sentinel://").rsplit("/", 1)[0] + "/mymaster"
    done = scrapy_ha("--redis-url", sentinel, "status", "books")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"error: {sentinel} is no Sentinel (ResponseError: "), done
    assert "a redis+sentinel:// URL names Sentinels" in done.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["dlq", "list", "books", "--limit", "-1"],
            "argument --limit: '-1' is not a whole number of 1 or more",
        ),
        # 0 listed nothing and said "empty" of a queue of 30 (QA)
        (["dlq", "list", "books", "--limit", "0"], "argument --limit: '0' is not a whole"),
        (["delayed", "list", "books", "--limit", "0"], "argument --limit: '0' is not a whole"),
        (
            ["dlq", "list", "books", "--offset", "-3"],
            "argument --offset: '-3' is not a whole number of 0 or more",
        ),
        (
            ["dlq", "purge", "books", "--all", "--limit", "-1", "--dry-run"],
            "argument --limit: '-1'",
        ),
        (["delayed", "list", "books", "--limit", "-2"], "argument --limit: '-2'"),
        (
            ["items", "books", "--to", "jsonl:/tmp/x.jl", "--batch", "0"],
            "argument --batch: '0' is not a whole number of 1 or more",
        ),
        (
            ["dashboard", "--port", "99999"],
            "argument --port: '99999' is not a whole number from 0 to 65535",
        ),
        (
            ["metrics", "--port", "-1"],
            "argument --port: '-1' is not a whole number from 0 to 65535",
        ),
        (["status", "books", "--domains", "x"], "argument --domains: 'x' is not a whole number"),
    ],
)
def test_numeric_options_are_checked_and_named(args, says):
    done = scrapy_ha(*args, "--redis-url", "redis://127.0.0.1:1/0")  # never reached
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_limit_and_an_offset_in_range_still_page(redis_url, redis_client):
    seed_dead(redis_client, 10, spider="books")
    listed = scrapy_ha(
        "--redis-url", redis_url, "dlq", "list", "books", "--limit", "3", "--offset", "8"
    )
    assert listed.returncode == 0 and "2 entries listed" in listed.stdout, listed.stdout


def test_a_mistyped_class_that_matches_nothing_is_named_with_the_nearest(redis_url, redis_client):
    """``dlq list --class gonee`` said "empty (for these filters)" and nothing else: a typo
    looked like a queue with no such entry."""
    seed_dead(redis_client, 3, spider="books")  # class gone, and one of the project's own
    typo = scrapy_ha("--redis-url", redis_url, "dlq", "list", "books", "--class", "gonee")
    assert typo.returncode == 0
    assert typo.stdout.strip() == "dead-letter queue of books: empty (for these filters)"
    assert typo.stderr.startswith(
        "note: --class gonee matched nothing; it is not a class scrapy-ha sets "
        "(did you mean gone? its classes: network, server,"
    ), typo.stderr
    purge = scrapy_ha(
        "--redis-url", redis_url, "dlq", "purge", "books", "--class", "gonee", "--dry-run"
    )
    assert "did you mean gone?" in purge.stderr, purge.stderr
    # a class of the project's own is filtered as it is, and a known one says nothing more
    own = scrapy_ha("--redis-url", redis_url, "dlq", "list", "books", "--class", "rare")
    assert own.stdout.splitlines()[-1] == "1 entry listed (rare 1)" and own.stderr == ""
    none = scrapy_ha("--redis-url", redis_url, "dlq", "list", "books", "--class", "banned")
    assert "empty" in none.stdout and none.stderr == ""
    delayed = scrapy_ha("--redis-url", redis_url, "delayed", "list", "books", "--class", "gatee")
    assert delayed.stdout.strip() == "no delayed request of books"
    assert "did you mean gate?" in delayed.stderr, delayed.stderr
    # waits for a proxy are class proxy: a script's --class no_proxy matched nothing, silently
    args = ("--redis-url", redis_url, "delayed", "retry-now", "books", "--class", "no_proxy")
    old = scrapy_ha(*args)
    assert "a request waiting for a proxy is of class proxy" in old.stderr, old.stderr


def test_entry_ids_with_all_or_a_filter_are_refused_not_half_read(redis_url, redis_client):
    """``dlq purge books --all 3 --yes`` purged entry 3 alone: the IDs were taken and --all
    went unread."""
    seed_dead(redis_client, 5, spider="books")
    for extra in (["--all"], ["--class", "gone"]):
        done = scrapy_ha("--redis-url", redis_url, "dlq", "purge", "books", "3", *extra, "--yes")
        assert done.returncode == 2, done.stderr
        assert f"name entry IDs or a selection ({extra[0]}), not both" in done.stderr
    assert redis_client.zcard("ha:{books}:dead") == 5


def test_a_back_pressure_mark_written_by_hand_does_not_break_status(redis_url, redis_client):
    """``SET ha:{books}:pressure garbage``: ``status`` failed with JSONDecodeError."""
    seed_dead(redis_client, 1, spider="books")
    for garbage in (b"garbage", b'["a"]', b'{"used": "x"}', b'{"since": 1e20}'):
        redis_client.set("ha:{books}:pressure", garbage)
        shown = scrapy_ha("--redis-url", redis_url, "status", "books")
        assert shown.returncode == 0, shown.stderr
        assert "back-pressure" in shown.stdout and "workers lease nothing new" in shown.stdout
        as_json = scrapy_ha("--redis-url", redis_url, "status", "books", "--json")
        assert as_json.returncode == 0, as_json.stderr


def test_a_held_count_written_by_hand_does_not_break_status(redis_url, redis_client):
    """``HSET ha:{books}:held "#gate example.com" abc``: ``status`` failed (ValueError)."""
    seed_dead(redis_client, 1, spider="books")
    redis_client.hset("ha:{books}:held", "#gate example.com", "abc")
    shown = scrapy_ha("--redis-url", redis_url, "status", "books")
    assert shown.returncode == 0, shown.stderr


def test_marks_and_counters_named_in_bytes_not_utf8_do_not_break_status(redis_url, redis_client):
    """``HSET ha:{books}:held "#gate \\xff" 1``: ``status`` failed (UnicodeDecodeError), and
    the dashboard's page of the crawl was a 409 naming a codec."""
    from tests.test_dashboard_api import dashboard

    seed_dead(redis_client, 1, spider="books")
    redis_client.hset("ha:{books}:held", b"#gate \xff.example", 1)
    redis_client.hset("ha:{books}:stats", b"acked:\xff", 3)
    redis_client.hset("ha:{books}:stats:domain", b"\xff.example\tacked", 2)
    for command in (["status", "books"], ["status", "books", "--json"], ["report", "books"]):
        shown = scrapy_ha("--redis-url", redis_url, *command)
        assert shown.returncode == 0, (command, shown.stderr)
    with dashboard(redis_url) as http:
        assert http.get("/crawls/books").status_code == 200
        assert http.get("/api/crawls/books").status_code == 200


def test_a_database_that_is_not_a_number_is_named(redis_url):
    """``--redis-url redis://host:port/abc`` read database 0, silently."""
    base = redis_url.rsplit("/", 1)[0]
    done = scrapy_ha("--redis-url", f"{base}/abc", "status", "books")
    assert done.returncode == 2, done.stderr
    assert "its path is not a database number" in done.stderr and "Traceback" not in done.stderr


def test_a_redis_that_goes_away_during_a_command_is_one_error_line(tmp_path):
    """``status --watch`` with Redis shut down under it: a ConnectionError traceback, exit
    1 (the documented exit code of an unreachable Redis is 2)."""
    import subprocess

    from tests import redis_servers
    from tests.cli_seed import ROOT, SCRAPY_HA

    server = redis_servers.start(tmp_path / "redis")
    try:
        url = f"redis://:pw@127.0.0.1:{server.port}/0"
        server.client().hset("ha:{books}:stats", "acked", 1)
        watch = subprocess.Popen(
            [SCRAPY_HA, "--redis-url", url, "status", "books", "--watch", "0.2"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert watch.stdout is not None
        watch.stdout.readline()  # it drew the status once: the command runs
        server.kill()
        _, err = watch.communicate(timeout=60)
        assert watch.returncode == 2, err
        assert f"error: Redis at redis://:***@127.0.0.1:{server.port}/0 went away" in err, err
        assert "Traceback" not in err and ":pw@" not in err
    finally:
        server.kill()
