"""The ``scrapy-ha`` command line's conventions, as users run it: global options anywhere
on the line, ``$REDIS_URL``, ``--version``, masked URLs in errors, ``--dry-run`` and
confirmation of bulk actions, and the dead-letter queue's filters and paging."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from scrapy_ha._version import __version__
from scrapy_ha.keys import Keys
from tests import backqueues
from tests.cli_seed import ROOT, SCRAPY_HA, dead_letters, scrapy_ha

GONE = [(f"http://a.example/gone/{i}", "gone", 404) for i in range(3)]
SERVER = [("http://b.example/down", "server", 503), ("http://a.example/down", "server", 500)]


@pytest.fixture
def dlq(redis_url):
    dead_letters(redis_url, "books", GONE + SERVER)
    return redis_url


def test_global_options_are_accepted_after_the_subcommand(dlq):
    for argv in (
        ["--redis-url", dlq, "dlq", "list", "books"],
        ["dlq", "--redis-url", dlq, "list", "books"],
        ["dlq", "list", "books", "--redis-url", dlq, "--prefix", "ha"],
    ):
        result = scrapy_ha(*argv)
        assert result.returncode == 0, (argv, result.stderr)
        assert result.stdout.splitlines()[-1] == "5 entries listed (gone 3, server 2)", argv
    other = scrapy_ha("dlq", "list", "books", "--redis-url", dlq, "--prefix", "shop")
    assert other.returncode == 1 and "no key of spider 'books' under shop:{books}:*" in (
        other.stderr
    )


def test_redis_url_comes_from_the_environment_unless_given(dlq, tmp_path):
    env = {**os.environ, "REDIS_URL": dlq}
    found = scrapy_ha("status", "books", "--json", env=env, cwd=tmp_path)
    assert found.returncode == 0, found.stderr and '"dead": 5' in found.stdout
    wrong = {**os.environ, "REDIS_URL": "redis://127.0.0.1:1/0"}
    given = scrapy_ha("status", "books", "--redis-url", dlq, env=wrong, cwd=tmp_path)
    assert given.returncode == 0, given.stderr


def test_version():
    result = scrapy_ha("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"scrapy-ha {__version__}"


@pytest.mark.parametrize(
    "url",
    ["redis://:s3cret@127.0.0.1:1/0", "redis://user:s3cret@127.0.0.1:1/0", "nope://:s3cret@x"],
)
def test_errors_name_the_url_with_the_password_masked(url):
    result = scrapy_ha("status", "books", "--redis-url", url)
    assert result.returncode == 2
    assert "s3cret" not in result.stderr and ":***@" in result.stderr, result.stderr


def test_a_bulk_action_without_a_terminal_needs_yes(dlq, redis_client):
    refused = scrapy_ha("dlq", "purge", "books", "--all", "--redis-url", dlq)
    assert refused.returncode == 1
    assert "refusing to purge 5 entries of books without --yes" in refused.stderr
    assert redis_client.zcard("ha:{books}:dead") == 5
    for argv in (["flush", "books"], ["checkpoints", "reset", "books", "--all"]):
        redis_client.set("ha:{books}:cp:shelf", b'{"page": 2}')
        result = scrapy_ha(*argv, "--redis-url", dlq)
        assert result.returncode == 1 and "without --yes" in result.stderr, argv
        assert redis_client.exists("ha:{books}:cp:shelf", "ha:{books}:dead") == 2


def test_dry_run_says_what_it_would_touch_and_touches_nothing(dlq, redis_client):
    result = scrapy_ha(
        "dlq", "requeue", "books", "--class", "server", "--dry-run", "--redis-url", dlq
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "would requeue 2 entries of books (dry run: nothing changed)"
    assert {line.split()[-1] for line in lines[1:]} == {u for u, _, _ in SERVER}
    flush = scrapy_ha("flush", "books", "--dry-run", "--redis-url", dlq)
    assert flush.stdout.startswith("would flush every key of books but its checkpoints (dry run")
    assert "dead: 5" in flush.stdout
    assert redis_client.zcard("ha:{books}:dead") == 5
    assert backqueues.count(redis_client, Keys("ha", "books")) == 0


def _on_a_terminal(argv: list[str], answer: bytes) -> tuple[int, str]:
    """Run the command with a pseudo-terminal as stdin, answer its question."""
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [SCRAPY_HA, *argv], stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT
    )
    os.close(slave)
    os.write(master, answer)
    out, _ = proc.communicate(timeout=120)
    os.close(master)
    return proc.returncode, out.decode()


def test_on_a_terminal_a_bulk_action_asks_first(dlq, redis_client):
    argv = ["dlq", "purge", "books", "--class", "gone", "--redis-url", dlq]
    code, out = _on_a_terminal(argv, b"n\n")
    assert code == 1 and "purge 3 entries of books? [y/N]" in out and "cancelled" in out
    assert redis_client.zcard("ha:{books}:dead") == 5
    code, out = _on_a_terminal(argv, b"\x04")  # Ctrl-D: no answer
    assert code == 1 and "cancelled" in out and "Traceback" not in out
    code, out = _on_a_terminal(argv, b"y\n")
    assert code == 0 and "purged 3 of 3 entries" in out
    assert redis_client.zcard("ha:{books}:dead") == 2


def _listed(url: str, *filters: str) -> list[str]:
    result = scrapy_ha("dlq", "list", "books", "--redis-url", url, *filters)
    assert result.returncode == 0, result.stderr
    return [line.split()[-1] for line in result.stdout.splitlines()[1:-1]]


def test_dlq_list_filters_by_status_domain_and_time(dlq, redis_client):
    assert _listed(dlq, "--status", "503") == ["http://b.example/down"]
    assert _listed(dlq, "--domain", "a.example", "--class", "server") == ["http://a.example/down"]
    # the gone entries were dead-lettered two days ago
    two_days_ago = (time.time() - 2 * 86400) * 1000
    for entry_id in redis_client.zrange("ha:{books}:dead", 0, 2):
        redis_client.zadd("ha:{books}:dead", {entry_id: two_days_ago}, xx=True)
    assert _listed(dlq, "--since", "24h") == [u for u, _, _ in SERVER]
    assert _listed(dlq, "--until", "1d") == [u for u, _, _ in GONE]
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(two_days_ago / 1000 - 60))
    assert len(_listed(dlq, "--since", since)) == 5
    shown = scrapy_ha("dlq", "list", "books", "--until", "1d", "--redis-url", dlq).stdout
    assert time.strftime("%Y-%m-%d %H:%M", time.localtime(two_days_ago / 1000)) in shown
    bad = scrapy_ha("dlq", "list", "books", "--since", "yesterday", "--redis-url", dlq)
    assert bad.returncode == 2 and "--since 'yesterday'" in bad.stderr


def test_until_includes_the_second_minute_or_day_it_names(dlq, redis_client):
    """A QA run: ``--until 2026-12-06`` listed nothing of that day, and ``--until`` an
    entry's own second, as ``dlq list`` shows it, left that entry out."""
    at = (time.time() - 2 * 86400) * 1000 // 1000 * 1000 + 127  # .127 into its second
    (entry_id,) = redis_client.zrange("ha:{books}:dead", 0, 0)
    redis_client.zadd("ha:{books}:dead", {entry_id: at}, xx=True)
    day = time.strftime("%Y-%m-%d", time.localtime(at / 1000))
    for named in (day, time.strftime("%Y-%m-%d %H:%M", time.localtime(at / 1000))):
        assert len(_listed(dlq, "--since", named, "--until", named)) == 1, named
    second = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at / 1000))
    assert len(_listed(dlq, "--until", second)) == 1
    assert len(_listed(dlq, "--since", second, "--until", second)) == 1


def test_dlq_list_pages_with_limit_and_offset(dlq):
    everything = _listed(dlq)
    assert _listed(dlq, "--limit", "2", "--offset", "1") == everything[1:3]
    assert _listed(dlq, "--class", "gone", "--offset", "2") == everything[2:3]
    gone_page = scrapy_ha("dlq", "list", "books", "--offset", "9", "--redis-url", dlq)
    assert gone_page.stdout.strip() == "dead-letter queue of books: empty (for these filters)"


def test_paging_deep_in_a_large_dead_letter_queue(redis_url):
    rows = [(f"http://c.example/p/{i}", "gone" if i % 2 else "server", 404) for i in range(3000)]
    dead_letters(redis_url, "books", rows)
    page = _listed(redis_url, "--offset", "2990", "--limit", "5")
    tail = _listed(redis_url, "--offset", "2995")
    assert len(page) == len(set(page)) == 5 and len(tail) == 5 and not set(page) & set(tail)
    gone = _listed(redis_url, "--class", "gone", "--offset", "1495")
    assert len(gone) == 5 and set(gone) <= {u for u, c, _ in rows if c == "gone"}


def test_dlq_show_prints_times_as_local_date_times(dlq, redis_client):
    entry_id = redis_client.zrange("ha:{books}:dead", 0, 0)[0].decode()
    dead_at = redis_client.zscore("ha:{books}:dead", entry_id)
    shown = json.loads(scrapy_ha("dlq", "show", "books", entry_id, "--redis-url", dlq).stdout)
    local = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(dead_at / 1000))
    assert shown["dead_at"] == local and shown["last"] == local
    exported = scrapy_ha("dlq", "export", "books", "--limit", "1", "--redis-url", dlq).stdout
    assert json.loads(exported)["dead_at"] == int(dead_at)  # scripts keep the numbers
