"""The ``scrapy-ha`` command line as a new user meets it: ``--version`` and ``--help`` at
once, every subcommand's help naming the options every command takes, a typo in a spider
name refused instead of making a crawl, errors written for a shell, one time format."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest
import redis.asyncio
from scrapy import Request

from scrapy_ha.cli import grammar
from scrapy_ha.codec import encode_request
from scrapy_ha.deadletters.archive import DEFAULT_TABLE
from scrapy_ha.keys import Keys
from scrapy_ha.ops.display import TIME_FORMAT
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry
from tests import backqueues
from tests.cli_seed import ROOT, SCRAPY_HA, _run, dead_letters, scrapy_ha

if TYPE_CHECKING:
    import argparse

#: Modules a command line that only asks for help or the version must not import.
HEAVY = ("scrapy", "twisted", "redis")
#: CPU seconds ``--version`` may cost: the issue's budget (it cost 1.5 s with Scrapy).
CPU_BUDGET = 0.3


def _cpu_of(argv: list[str]) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run the console script; its result and the CPU seconds it used (user + system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(
        [SCRAPY_HA, *argv], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return result, used


@pytest.mark.parametrize(
    "argv",
    [["--version"], ["--help"], ["dlq", "list", "--help"], ["metrics", "--help"], ["bogus"]],
)
def test_help_version_and_usage_errors_import_neither_scrapy_nor_redis(argv):
    code = (
        "import sys\n"
        "from scrapy_ha.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print('LOADED', sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "LOADED []" in result.stdout, result.stdout + result.stderr


def test_version_answers_within_the_cpu_budget():
    result, cpu = _cpu_of(["--version"])
    assert result.returncode == 0 and result.stdout.startswith("scrapy-ha ")
    assert cpu < CPU_BUDGET, f"--version used {cpu:.2f} s of CPU"
    result, cpu = _cpu_of(["dlq", "purge", "--help"])
    assert result.returncode == 0 and "--redis-url" in result.stdout
    assert cpu < CPU_BUDGET, f"dlq purge --help used {cpu:.2f} s of CPU"


def _leaves(parser: argparse.ArgumentParser, words: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every runnable command line's parser, by its words (``dlq list``, ``metrics``...)."""
    found: dict[str, argparse.ArgumentParser] = {}
    subs = parser._subparsers._group_actions if parser._subparsers else []
    for action in subs:
        for name, sub in action.choices.items():
            found |= _leaves(sub, f"{words}{name} ") or {f"{words}{name}": sub}
    return found


@pytest.mark.parametrize("words", sorted(_leaves(grammar.build_parser())))
def test_every_subcommand_help_lists_the_options_every_command_takes(words):
    parser = _leaves(grammar.build_parser())[words]
    text = parser.format_help()
    assert "--redis-url" in text and "--prefix" in text, text
    on_one_crawl = words not in ("metrics", "dashboard")
    assert ("--shards" in text) == on_one_crawl, text


def test_the_help_of_the_archive_names_its_real_default_table():
    text = _leaves(grammar.build_parser())["dlq archive"].format_help()
    assert DEFAULT_TABLE in text.replace("\n", "").replace(" ", "")


def test_the_defaults_of_items_are_the_consumers_own():
    from scrapy_ha.config import items as config
    from scrapy_ha.sinks import sql

    args = grammar.parse(["items", "books", "--to", "jsonl:out.jsonl"])
    assert (args.table, args.batch, args.claim_idle) == (
        sql.DEFAULT_TABLE,
        config.DEFAULT_BATCH,
        config.DEFAULT_CLAIM_IDLE,
    )


#: Commands on one crawl, as a user with a typo in the spider name runs them.
ON_A_CRAWL = [
    ["pause", "nosuch"],
    ["resume", "nosuch"],
    ["workers", "nosuch"],
    ["push", "nosuch", "http://a.example/"],
    ["status", "nosuch"],
    ["report", "nosuch"],
    ["flush", "nosuch", "--yes"],
    ["delayed", "list", "nosuch"],
    ["delayed", "retry-now", "nosuch", "--all", "--yes"],
    ["dlq", "list", "nosuch"],
    ["dlq", "requeue", "nosuch", "--all", "--yes"],
    ["checkpoints", "list", "nosuch"],
    ["items", "nosuch", "--to", "jsonl:nosuch.jl", "--exit-idle", "1"],
    # actions that make nothing: before, they too said "pass --create"
    ["items", "nosuch", "--to", "jsonl:nosuch.jl", "--aside"],
    ["items", "nosuch", "--to", "jsonl:nosuch.jl", "--retry-aside"],
    ["items", "nosuch", "--to", "jsonl:nosuch.jl", "--undeclare", "--yes"],
]


@pytest.mark.parametrize("argv", ON_A_CRAWL, ids=lambda a: " ".join(a[:2] + a[4:5]))
def test_a_command_on_a_crawl_that_does_not_exist_fails_and_makes_nothing(
    argv, redis_url, redis_client
):
    dead_letters(redis_url, "books", [("http://a.example/gone", "gone", 404)])
    before = sorted(redis_client.keys("*"))
    result = scrapy_ha(*argv, "--redis-url", redis_url)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith("error: no such crawl: no key of spider 'nosuch'")
    assert "check the spider name, --prefix and --redis-url" in result.stderr
    makes = argv[0] in ("pause", "push") or argv[-1] == "1"  # (items consuming)
    assert ("pass --create" in result.stderr) == makes
    assert sorted(redis_client.keys("*")) == before


def test_create_makes_the_crawl_where_making_one_is_meant(redis_url, redis_client):
    paused = scrapy_ha("pause", "later", "--create", "--redis-url", redis_url)
    assert paused.returncode == 0, paused.stderr
    assert redis_client.exists("ha:{later}:paused")
    status = scrapy_ha("status", "later", "--redis-url", redis_url)
    assert status.returncode == 0 and "paused" in status.stdout
    pushed = scrapy_ha("push", "seeded", "http://a.example/", "--create", "--redis-url", redis_url)
    assert pushed.returncode == 0, pushed.stderr
    assert backqueues.count(redis_client, Keys("ha", "seeded")) == 1
    again = scrapy_ha("push", "seeded", "http://a.example/2", "--redis-url", redis_url)
    assert again.returncode == 0, again.stderr  # it exists now: no --create needed


@pytest.mark.parametrize(
    "argv", [["status", "books"], ["dlq", "list", "books"], ["pause", "books", "--create"]]
)
def test_a_shard_count_given_for_an_unsharded_crawl_is_refused(argv, redis_url, redis_client):
    """A QA run: ``--shards 2`` on an unsharded crawl read "no such crawl", and ``pause
    --create`` paused two shards no worker reads, saying the crawl was paused."""
    dead_letters(redis_url, "books", [("http://a.example/gone", "gone", 404)])
    before = sorted(redis_client.keys("*"))
    result = scrapy_ha(*argv, "--shards", "2", "--redis-url", redis_url)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(
        "error: HA_SHARDS=2 but the crawl of books is in Redis unsharded (HA_SHARDS=1): give "
        "--shards 1"
    ), result.stderr
    assert sorted(redis_client.keys("*")) == before


def test_a_shard_count_of_the_project_is_not_told_to_be_left_out(redis_url, tmp_path):
    """A QA run: in a project with ``HA_SHARDS = 3``, ``status`` of an unsharded crawl said
    "give --shards 1 (or none: ...)", though no --shards was given: the project's count."""
    dead_letters(redis_url, "books", [("http://a.example/gone", "gone", 404)])
    (tmp_path / "shard_settings.py").write_text("HA_SHARDS = 3\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "SCRAPY_SETTINGS_MODULE": "shard_settings"}
    result = scrapy_ha("status", "books", "--redis-url", redis_url, env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip() == (
        "error: HA_SHARDS=3 but the crawl of books is in Redis unsharded (HA_SHARDS=1): give "
        "--shards 1 (the project's settings give HA_SHARDS=3: --shards overrides them)"
    ), result.stderr
    assert (
        scrapy_ha("status", "books", "--shards", "1", "--redis-url", redis_url, env=env).returncode
        == 0
    )


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://127.0.0.1:1/0", "cannot reach Redis at redis://127.0.0.1:1/0 within 5 s"),
        ("redis://:s3cret@127.0.0.1:1/0", "cannot reach Redis at redis://:***@127.0.0.1:1/0"),
    ],
)
def test_an_unreachable_redis_is_explained_for_the_command_line(url, says):
    result = scrapy_ha("workers", "books", "--redis-url", url)
    assert result.returncode == 2
    error = result.stderr.strip()
    assert error.startswith(f"error: {says}"), error
    assert "worker" not in error.replace("workers books", "")  # no "from this worker"
    assert not re.search(r"\.\)|\.\.|\)\.", error), error  # no doubled punctuation
    assert error.endswith("Give its address with --redis-url or $REDIS_URL")
    assert "s3cret" not in error


def test_an_unreachable_cluster_is_explained_as_a_cluster():
    """The hint asked whether "redis-server" ran at the URL, where a cluster whose nodes the
    URL names were down, or failing over to replicas the URL does not name, answered no."""
    url = "redis+cluster://127.0.0.1:1,127.0.0.1:2"
    result = scrapy_ha("workers", "books", "--redis-url", url)
    assert result.returncode == 2
    error = result.stderr.strip()
    assert error.startswith(f"error: cannot reach Redis at {url} within 5 s"), error
    assert "is redis-server running there?" not in error
    assert "A replica taking over answers within the cluster's cluster-node-timeout" in error
    assert error.endswith("Give the address of more of its nodes with --redis-url or $REDIS_URL")


def test_a_server_that_is_not_redis_is_named_as_such(site):
    url = site.url.replace("http://", "redis://")  # the demo site: HTTP, not Redis
    result = scrapy_ha("workers", "books", "--redis-url", url)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "does not answer as a Redis server does" in result.stderr


#: A local date-time as every command prints it (TIME_FORMAT).
LOCAL_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
assert TIME_FORMAT == "%Y-%m-%d %H:%M:%S"


def test_every_command_prints_times_in_one_format(redis_url):
    dead_letters(redis_url, "books", [("http://a.example/gone", "gone", 404)])
    outputs = {
        "status": scrapy_ha("status", "books", "--redis-url", redis_url).stdout,
        "report": scrapy_ha("report", "books", "--redis-url", redis_url).stdout,
        "dlq list": scrapy_ha("dlq", "list", "books", "--redis-url", redis_url).stdout,
    }
    for name, out in outputs.items():
        assert LOCAL_TIME.search(out), (name, out)
        # no ISO "T", no time zone name or offset after a time
        assert not re.search(r"\d\dT\d\d|:\d\d[+-]\d\d:?\d\d|:\d\d [A-Z]{3,4}\b", out), (name, out)


async def _gated(url: str) -> None:
    """Spider ``shop``: 4 done now, 1 retry due in an hour, 3 requests deferred for the
    closed gate of shop.example, due in 20 minutes."""
    client = redis.asyncio.Redis.from_url(url)
    queue = RedisQueue(client, Keys("ha", "shop"))
    urls = [f"http://shop.example/{i}" for i in range(8)]
    await queue.enqueue([NewEntry(u.encode(), 0, encode_request(Request(u), None)) for u in urls])
    leases = await queue.lease(8, 600_000)
    await queue.ack([(x.id, x.token) for x in leases[:4]])
    await queue.retry_later(leases[4].id, leases[4].token, 3_600_000, b"", failure_class="server")
    await queue.close_gate("shop.example", 1_200_000)
    for x in leases[5:]:
        await queue.retry_later(x.id, x.token, 1_200_000, b"")
    await client.aclose()


def test_status_and_delayed_list_say_what_waits_for_a_gate_and_count_it_in_the_eta(redis_url):
    _run(_gated(redis_url))
    status = scrapy_ha("status", "shop", "--redis-url", redis_url).stdout
    assert "delayed  4: 1 retry, 3 waiting for a closed gate (shop.example 3)" in status
    eta = next(line for line in status.splitlines() if line.strip().startswith("eta"))
    assert re.search(r"eta  (5\dm|1h) ", eta), eta  # the retry due in an hour: not minutes
    doc = json.loads(scrapy_ha("status", "shop", "--json", "--redis-url", redis_url).stdout)
    assert doc["waiting"]["gate"] == {"shop.example": 3} and doc["waiting"]["retries"] == 1
    assert doc["eta_seconds"] >= 3000
    listed = scrapy_ha("delayed", "list", "shop", "--class", "gate", "--redis-url", redis_url)
    rows = listed.stdout.splitlines()[1:-1]
    assert len(rows) == 3 and all(row.split()[5] == "gate" for row in rows), listed.stdout


def test_a_sink_may_be_declared_before_its_crawl(redis_url, redis_client, tmp_path):
    to = f"jsonl:{tmp_path / 'items.jl'}"
    declared = scrapy_ha("items", "later", "--to", to, "--declare", "--redis-url", redis_url)
    assert declared.returncode == 0, declared.stderr
    assert redis_client.xinfo_groups("ha:{later}:items")[0]["name"] == f"{to}".encode()


@pytest.mark.parametrize(
    "argv",
    [["items", "wide", "--to", "jsonl:{tmp}/a.jl", "--declare"], ["pause", "wide", "--create"]],
)
def test_a_sharded_crawl_made_by_a_command_stores_its_shard_count(
    argv, redis_url, redis_client, tmp_path
):
    """A QA run: ``items S --shards 4 --declare`` stored no shard count: ``status S`` found
    no crawl, a declare without ``--shards`` then made an unsharded crawl, and workers of
    one shard were taken, their items in a stream no declared sink read."""
    import redis.asyncio

    from scrapy_ha.config.validate import ConfigError
    from scrapy_ha.store.sharding import check_shard_count, make_queue

    made = [a.format(tmp=tmp_path) for a in argv]
    done = scrapy_ha(*made, "--shards", "4", "--redis-url", redis_url)
    assert done.returncode == 0, done.stderr
    assert redis_client.get("ha:{wide}:shards") == b"4"
    status = scrapy_ha("status", "wide", "--redis-url", redis_url)
    assert status.returncode == 0, status.stderr

    async def one_shard_worker() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            with pytest.raises(ConfigError, match="HA_SHARDS=1 but the crawl of wide"):
                await check_shard_count(make_queue(client, "ha", "wide", 1))
        finally:
            await client.aclose()

    _run(one_shard_worker())


@pytest.mark.parametrize("command", [["dlq", "list"], ["dlq", "export"]])
def test_output_whose_reader_went_away_ends_quietly(redis_url, command):
    """``scrapy-ha dlq list S | head -1``: the reader closes the pipe after its first line.
    Before, the next write raised BrokenPipeError, printed as a traceback."""
    rows = [(f"http://a.test/{n}", "gone", 404) for n in range(200)]
    dead_letters(redis_url, "piped", rows)
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    try:
        done = subprocess.run(
            [SCRAPY_HA, "--redis-url", redis_url, *command, "piped"],
            stdout=write,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
            timeout=120,
        )
    finally:
        os.close(write)
    assert b"Traceback" not in done.stderr and b"BrokenPipe" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stderr


def test_the_command_runs_as_a_module_too(redis_url):
    """``python -m scrapy_ha.cli``, where the console script is not on the PATH (before: "No
    module named scrapy_ha.cli.__main__")."""
    command = [sys.executable, "-m", "scrapy_ha.cli", "--redis-url", redis_url]
    done = subprocess.run([*command, "status", "nosuch"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 1 and "no such crawl" in done.stderr, done.stderr


@pytest.mark.parametrize("to", ["jsonl:", "jsonl:{tmp}"])
def test_a_jsonl_sink_without_a_file_is_a_usage_error(redis_url, redis_client, tmp_path, to):
    """``--to jsonl:`` or a directory: before, IsADirectoryError's traceback (exit 1), and
    the sink's consumer group was left in Redis (every later item waited for it)."""
    dead_letters(redis_url, "nosink", [("http://a.test/1", "gone", 404)])  # a crawl in Redis
    done = scrapy_ha("--redis-url", redis_url, "items", "nosink", "--to", to.format(tmp=tmp_path))
    assert done.returncode == 2, done.stderr
    assert "name a file after jsonl:" in done.stderr and "Traceback" not in done.stderr
    assert not redis_client.exists(Keys("ha", "nosink").items)  # no group made


def test_a_sink_that_does_not_open_is_one_error_line_and_no_group(
    redis_url, redis_client, tmp_path
):
    """A database the sink cannot open (a mistyped path or host): before, SQLAlchemy's
    traceback, and the sink's consumer group left in Redis, keeping every item for ever."""
    dead_letters(redis_url, "nodb", [("http://a.test/1", "gone", 404)])  # a crawl in Redis
    url = f"sqlite:///{tmp_path}/no-such-dir/items.db"
    done = scrapy_ha("--redis-url", redis_url, "items", "nodb", "--to", url)
    assert done.returncode == 2, done.stderr
    assert f"error: --to {url}: the sink did not open: " in done.stderr, done.stderr
    assert "unable to open database file" in done.stderr and "Traceback" not in done.stderr
    assert redis_client.xinfo_groups(Keys("ha", "nodb").items) == []  # no group left


async def _parked(url: str) -> None:
    """Spider ``parked``: 1 retry delayed; 3 new requests of shop.example parked in its back
    queue behind its closed gate; 2 of other.example parked until a time already past (a
    paused crawl leases nothing, so nothing takes them back)."""
    client = redis.asyncio.Redis.from_url(url)
    keys = Keys("ha", "parked")
    queue = RedisQueue(client, keys)
    first = "http://first.example/0"
    await queue.enqueue([NewEntry(first.encode(), 0, encode_request(Request(first), None))])
    (lease,) = await queue.lease(1, 600_000)
    await queue.retry_later(lease.id, lease.token, 3_600_000, b"", failure_class="server")
    await queue.close_gate("shop.example", 1_200_000)
    await queue.close_gate("other.example", 1_200_000)
    urls = [f"http://shop.example/{i}" for i in range(3)]
    urls += [f"http://other.example/{i}" for i in range(2)]
    await queue.enqueue([NewEntry(u.encode(), 0, encode_request(Request(u), None)) for u in urls])
    assert await queue.lease(10, 600_000) == []  # both queues parked behind their gates
    await client.hdel(keys.gates, "other.example")  # its gate gone: its time has come
    for qid in await client.zrange(keys.waiting, 0, -1):
        if b"other.example" in qid:
            await client.zadd(keys.waiting, {qid: 1})
    await client.aclose()


def test_status_says_what_waits_in_back_queues_apart_from_the_delayed_set(redis_url):
    """The `delayed` line counted the pending requests of parked back queues as delayed
    entries, and a queue whose time had come as "held by domain limits" (no limits set)."""
    _run(_parked(redis_url))
    status = scrapy_ha("status", "parked", "--redis-url", redis_url).stdout
    assert "delayed  1: 1 retry;" in status, status
    assert "parked  pending: 3 behind a closed gate (shop.example 3)" in status, status
    held = next(line for line in status.splitlines() if "parked  pending" in line)
    assert "other.example" not in held and "limits" not in status, status


def test_a_dlq_window_that_ends_before_it_starts_is_a_usage_error(redis_url):
    """``--since 1h --until 2h`` listed nothing, silently (a window of nothing)."""
    dead_letters(redis_url, "window", [("http://a.test/1", "gone", 404)])
    done = scrapy_ha(
        "--redis-url", redis_url, "dlq", "list", "window", "--since", "1h", "--until", "2h"
    )
    assert done.returncode == 2 and "--since is later than --until" in done.stderr, done.stderr
    fine = scrapy_ha("--redis-url", redis_url, "dlq", "list", "window", "--since", "2h")
    assert fine.returncode == 0 and "http://a.test/1" in fine.stdout, fine.stderr


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (("--url", "notaurl"), "error: --url 'notaurl': "),
        (("--url", "sqlite:///x.db", "--table", "bad table"), "error: --table 'bad table': "),
    ],
)
def test_dlq_archive_names_the_option_it_was_given(redis_url, given, said):
    """It named the project's settings (HA_DLQ_ARCHIVE_URL=...) for an option's value."""
    dead_letters(redis_url, "arch", [("http://a.test/1", "gone", 404)])
    done = scrapy_ha("--redis-url", redis_url, "dlq", "archive", "arch", *given)
    assert done.returncode == 2 and done.stderr.startswith(said), done.stderr


def test_parked_queues_are_read_past_those_whose_time_has_come(redis_url, monkeypatch):
    """The first WAITING_QUEUES by time were read, then those due dropped: a paused crawl
    with that many due showed none of those truly parked."""
    from scrapy_ha.ops import waiting

    _run(_parked(redis_url))  # other.example due (time 1), shop.example parked
    monkeypatch.setattr(waiting, "WAITING_QUEUES", 1)

    async def read() -> waiting.Waiting:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            return await waiting.read_waiting(client, [Keys("ha", "parked")])
        finally:
            await client.aclose()

    assert _run(read()).parked == {"gate": {"shop.example": 3}}


def test_create_is_refused_with_an_items_action_that_makes_nothing(redis_url, redis_client):
    result = scrapy_ha(
        "items",
        "nosuch",
        "--to",
        "jsonl:nosuch.jl",
        "--aside",
        "--create",
        "--redis-url",
        redis_url,
    )
    assert (result.returncode, result.stderr.strip()) == (
        2,
        "error: --create goes with consuming or --declare",
    )
    assert redis_client.keys("*") == []
