"""What the ``scrapy-ha`` commands are given that they must refuse with a sentence, never a
traceback or a loop: a crawl key of the wrong type read first, a user the ACL denies PING,
``status --watch nan``; and ``dashboard --port 0`` says the port it got. The console
script in a subprocess, a real redis-server."""

from __future__ import annotations

import re
import subprocess
from urllib.parse import urlsplit, urlunsplit
from urllib.request import urlopen

import pytest

from scrapy_ha.demo import harness
from tests.test_cli import SCRAPY_HA, scrapy_ha
from tests.test_metrics import START_TIMEOUT, _first_line

#: How the CLI names a key of the wrong type: the crawl's claim of its dupefilter is read
#: by the one reader of claims (scrapy_ha.store.claims), the other keys by the crawl's.
SHARDS_NAMED = "error: ha:{books}:shards holds a hash (scrapy-ha keeps a string there)"
CLAIM_NAMED = "error: the crawl's claim ha:{books}:filter is unreadable: it holds a hash"


@pytest.mark.parametrize(
    ("key", "command", "named"),
    [
        ("ha:{books}:shards", ["status", "books"], SHARDS_NAMED),
        ("ha:{books}:shards", ["push", "books", "https://a.example/"], SHARDS_NAMED),
        ("ha:{books}:filter", ["push", "books", "https://a.example/"], CLAIM_NAMED),
    ],
)
def test_a_crawl_key_of_the_wrong_type_read_first_is_named(
    redis_url, redis_client, key, command, named
):
    redis_client.hset("ha:{books}:stats", "acked", 1)
    redis_client.hset(key, "x", 1)
    done = scrapy_ha("--redis-url", redis_url, *command)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(named), done.stderr
    assert "Traceback" not in done.stderr


def test_a_user_the_acl_denies_ping_is_named_not_the_database(redis_url, redis_client):
    user = "ops3-no-ping"
    acl = ("on", ">s3cret", "~*", "&*", "+@all", "-ping")
    redis_client.execute_command("ACL", "SETUSER", user, *acl)
    try:
        parts = urlsplit(redis_url)
        url = urlunsplit(parts._replace(netloc=f"{user}:s3cret@{parts.netloc}"))
        done = scrapy_ha("--redis-url", url, "status", "books")
    finally:
        redis_client.execute_command("ACL", "DELUSER", user)
    assert done.returncode == 2, done.stderr
    assert "refused a command to the user of the URL (NoPermissionError" in done.stderr
    assert "database" not in done.stderr and "s3cret" not in done.stderr
    assert "Traceback" not in done.stderr


#: A Redis no one listens on: a --watch refused is refused before any connection.
NOWHERE = "redis://127.0.0.1:1/0"


@pytest.mark.parametrize("watch", ["nan", "inf", "-1", "0", "1e-300", "0.05", "x"])
def test_status_watch_refuses_a_refresh_below_a_tenth_of_a_second_before_redis(watch):
    done = scrapy_ha("--redis-url", NOWHERE, "status", "books", "--watch", watch)
    assert done.returncode == 2
    assert done.stderr.endswith(
        f"error: argument --watch: {watch!r} is not a finite number of seconds of 0.1 or more\n"
    ), done.stderr


def test_dashboard_port_0_prints_the_port_it_listens_on(redis_url):
    command = [SCRAPY_HA, "--redis-url", redis_url, "dashboard", "--port", "0"]
    proc = harness.spawn(command, stdout=subprocess.PIPE)
    try:
        line = _first_line(proc, START_TIMEOUT)
        found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert found and found.group(1) != "0", line
        with urlopen(found.group(0) + "api/crawls", timeout=START_TIMEOUT) as answer:
            assert answer.status == 200
    finally:
        harness.stop(proc)
