"""What ``scrapy-ha items --to`` takes, run as users run it (the console script in a
subprocess, a real redis-server): a SQLite database in memory is refused, a relative SQLite
path is one file wherever the consumer starts, a pipeline that does not import is one
error line."""

from __future__ import annotations

import pytest

from scrapy_ha.keys import Keys
from tests.cli_seed import dead_letters, scrapy_ha
from tests.scrapy_project import write_project


@pytest.mark.parametrize("to", ["sqlite://", "sqlite:///", "sqlite:///:memory:"])
def test_a_sqlite_database_in_memory_is_refused(redis_url, redis_client, to):
    """Before: ``consumed 3 item(s)``, exit 0, and the items acknowledged into a database
    that was gone with the consumer (``--to sqlite:///$DB`` with ``$DB`` unset)."""
    dead_letters(redis_url, "mem", [("http://a.test/1", "gone", 404)])  # a crawl in Redis
    done = scrapy_ha("--redis-url", redis_url, "items", "mem", "--to", to, "--exit-idle", "1")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith(
        f"error: item sink {to!r}: a SQLite database in memory loses everything"
    ), done.stderr
    assert "Traceback" not in done.stderr
    assert not redis_client.exists(Keys("ha", "mem").items)  # no group made


def test_a_relative_sqlite_path_names_one_file_wherever_the_consumer_starts(redis_url, tmp_path):
    """Two consumers of ``sqlite:///rel.db`` in two directories joined one group (named
    after the URL as written) and split the items between two files."""
    dead_letters(redis_url, "rel", [("http://a.test/1", "gone", 404)])
    groups = []
    for place in ("one", "two"):
        (tmp_path / place).mkdir()
        done = scrapy_ha(
            "--redis-url", redis_url, "items", "rel", "--to", "sqlite:///rel.db", "--declare",
            cwd=tmp_path / place,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        groups.append(done.stdout.split()[1])
    assert groups == [
        f"sql:sqlite:///{tmp_path}/one/rel.db#scrapy_ha_items",
        f"sql:sqlite:///{tmp_path}/two/rel.db#scrapy_ha_items",
    ]


def test_a_pipeline_that_does_not_import_is_one_error_line(redis_url, redis_client, tmp_path):
    """Before: ModuleNotFoundError's traceback, exit 1."""
    settings = 'HA_ITEMS = "outbox"\nHA_ITEMS_PIPELINES = {"nope.Pipe": 100}\n'
    spiders = 'import scrapy\n\n\nclass P(scrapy.Spider):\n    name = "probe"\n'
    project = write_project(tmp_path / "project", "badpipes", spiders, settings)
    dead_letters(redis_url, "probe", [("http://a.test/1", "gone", 404)])
    done = scrapy_ha("--redis-url", redis_url, "items", "probe", "--to", "pipelines", cwd=project)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(
        "error: HA_ITEMS_PIPELINES: a pipeline could not be made (ModuleNotFoundError: "
        "No module named 'nope')"
    ), done.stderr
    assert "Traceback" not in done.stderr
    assert not redis_client.exists(Keys("ha", "probe").items)


@pytest.mark.parametrize(
    "settings",
    [
        'HA_ITEMS = "outbox"\n',
        'HA_ITEMS = "outbox"\n'
        'HA_ITEMS_PIPELINES = {"scrapy.pipelines.files.FilesPipeline": None}\n',
    ],
    ids=["none", "switched-off"],
)
def test_pipelines_that_name_no_pipeline_are_refused(redis_url, redis_client, tmp_path, settings):
    """``--to pipelines`` in a project without a pipeline acknowledged every item into
    nothing: "consumed 3 item(s)", exit 0, the stream emptied (QA)."""
    spiders = 'import scrapy\n\n\nclass P(scrapy.Spider):\n    name = "probe"\n'
    project = write_project(tmp_path / "project", "nopipes", spiders, settings)
    dead_letters(redis_url, "probe", [("http://a.test/1", "gone", 404)])
    done = scrapy_ha("--redis-url", redis_url, "items", "probe", "--to", "pipelines", cwd=project)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert (
        "\nerror: --to pipelines: no item pipeline is enabled (HA_ITEMS_PIPELINES, else "
        "ITEM_PIPELINES)" in done.stderr
    ), done.stderr
    items = Keys("ha", "probe").items
    assert not redis_client.exists(items) or redis_client.xinfo_groups(items) == []  # none left


def test_a_dead_letter_archive_in_memory_is_refused(redis_url, redis_client):
    """``dlq archive --url sqlite://`` marked the dead letters archived in a database gone
    with the command, and ``dlq purge`` then took them out of Redis as archived."""
    dead_letters(redis_url, "arch", [("http://a.test/1", "gone", 404)])
    done = scrapy_ha("--redis-url", redis_url, "dlq", "archive", "arch", "--url", "sqlite://")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith(
        "error: --url 'sqlite://': a SQLite database in memory loses everything"
    ), done.stderr
    assert redis_client.zcard(Keys("ha", "arch").dead) == 1
    assert not redis_client.exists(Keys("ha", "arch").dead_archived)  # nothing marked


def test_a_group_declared_by_mistake_is_undeclared_and_stops_keeping_items(
    redis_url, redis_client, tmp_path
):
    """``--declare`` of a mistyped sink made a group that kept every later item in the
    stream, and no command took it away."""
    keys = Keys("ha", "shop")
    dead_letters(redis_url, "shop", [("http://a.test/1", "gone", 404)])
    base = ("--redis-url", redis_url, "items", "shop")
    good, typo = f"jsonl:{tmp_path / 'items.jl'}", "jsonl:/typo/items.jl"
    for to in (good, typo):
        assert scrapy_ha(*base, "--to", to, "--declare").returncode == 0
    for i in range(4):
        redis_client.xadd(keys.items, {"i": f'{{"n": {i}}}'})
    run = scrapy_ha(*base, "--to", good, "--exit-idle", "0.2")
    assert run.returncode == 0 and "consumed 4 item(s)" in run.stdout, run.stderr
    assert redis_client.xlen(keys.items) == 4  # the typo's group has none of them

    cli = (*base, "--to", typo, "--undeclare")
    refused = scrapy_ha(*cli)  # stdin is not a terminal
    assert refused.returncode == 1 and "without --yes" in refused.stderr, refused.stderr
    dry = scrapy_ha(*cli, "--dry-run")
    assert dry.returncode == 0 and dry.stdout.splitlines() == [
        "would undeclare group jsonl:/typo/items.jl of shop (dry run: nothing changed)",
        "  jsonl:/typo/items.jl: 4 items it has not consumed, lost to its sink",
    ], dry.stdout
    done = scrapy_ha(*cli, "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "undeclared group jsonl:/typo/items.jl of shop (4 items it has not consumed, lost to "
        "its sink); 4 entries every other group had left the stream"
    )
    assert redis_client.xlen(keys.items) == 0
    assert [g["name"] for g in redis_client.xinfo_groups(keys.items)] == [
        f"jsonl:{tmp_path / 'items.jl'}".encode()
    ]
    again = scrapy_ha(*cli, "--yes")
    assert again.returncode == 1 and "no group jsonl:/typo/items.jl" in again.stderr
    misuse = scrapy_ha(*base, "--to", good, "--yes")
    assert misuse.returncode == 2 and "--yes and --dry-run go with --undeclare" in misuse.stderr


def test_a_group_whose_consumer_runs_is_not_undeclared(redis_url, redis_client, tmp_path):
    keys = Keys("ha", "shop")
    dead_letters(redis_url, "shop", [("http://a.test/1", "gone", 404)])
    to = f"jsonl:{tmp_path / 'items.jl'}"
    base = ("--redis-url", redis_url, "items", "shop", "--to", to)
    assert scrapy_ha(*base, "--declare").returncode == 0
    redis_client.xadd(keys.items, {"i": "{}"})
    redis_client.xreadgroup(to, "worker-a", {keys.items: ">"})  # a consumer reading now
    refused = scrapy_ha(*base, "--undeclare", "--yes")
    assert refused.returncode == 1, refused.stderr
    assert "has consumers that read less than 60 s ago (worker-a): stop them" in refused.stderr
    assert len(redis_client.xinfo_groups(keys.items)) == 1


def test_a_group_named_by_a_relative_path_before_is_still_consumed(
    redis_url, redis_client, tmp_path
):
    """The default group of ``sqlite:///rel.db`` holds the absolute path now: a group
    declared under the old name (the URL as written) would have been left behind, keeping
    every later item in the stream."""
    keys = Keys("ha", "rel")
    dead_letters(redis_url, "rel", [("http://a.test/1", "gone", 404)])
    redis_client.xadd(keys.items, {"i": '{"n": 1}'})
    redis_client.xgroup_create(keys.items, "sql:sqlite:///rel.db#scrapy_ha_items", id="0")
    base = ("--redis-url", redis_url, "items", "rel", "--to", "sqlite:///rel.db")
    done = scrapy_ha(*base, "--exit-idle", "0.2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "consuming into group sql:sqlite:///rel.db#scrapy_ha_items, named by" in done.stderr
    assert "consumed 1 item(s)" in done.stdout
    assert [g["name"] for g in redis_client.xinfo_groups(keys.items)] == [
        b"sql:sqlite:///rel.db#scrapy_ha_items"
    ]


def test_a_pipelines_group_is_undeclared_with_no_pipeline_left(redis_url, redis_client, tmp_path):
    """Review: the check for a pipeline refused ``--undeclare`` and ``--aside`` too, though
    they write nothing: an operator who took the pipelines out could not undeclare their
    group, which keeps every later item in the stream."""
    spiders = 'import scrapy\n\n\nclass P(scrapy.Spider):\n    name = "probe"\n'
    project = write_project(tmp_path / "project", "gone", spiders, 'HA_ITEMS = "outbox"\n')
    dead_letters(redis_url, "probe", [("http://a.test/1", "gone", 404)])
    items = Keys("ha", "probe").items
    redis_client.xgroup_create(items, "pipelines", id="0", mkstream=True)
    base = ("--redis-url", redis_url, "items", "probe", "--to", "pipelines")
    listed = scrapy_ha(*base, "--aside", cwd=project)
    assert listed.returncode == 0, listed.stderr
    done = scrapy_ha(*base, "--undeclare", "--yes", cwd=project)
    assert done.returncode == 0, done.stderr
    assert redis_client.xinfo_groups(items) == []
