"""The ``scrapy-ha`` command line is dispatched by argparse: each subcommand's parser
carries the function it runs (imported once parsed), with the arguments it takes."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from scrapy_ha.cli import checkpoints, delayed, dlq, flush, pause, push, status, workers
from scrapy_ha.cli import grammar as cli

if TYPE_CHECKING:
    import argparse

COMMANDS = [
    (["status", "books", "--json"], status.status),
    (["flush", "books", "--force"], flush.flush),
    (["dlq", "list", "books", "--class", "gone", "--limit", "3"], dlq.dlq_list),
    (["dlq", "show", "books", "17"], dlq.dlq_show),
    (["dlq", "export", "books", "--domain", "example.com"], dlq.dlq_export),
    (["dlq", "requeue", "books", "1", "2"], dlq.dlq_requeue),
    (["dlq", "purge", "books", "--all"], dlq.dlq_purge),
    (["checkpoints", "list", "books"], checkpoints.checkpoints_list),
    (["checkpoints", "show", "books", "shelf"], checkpoints.checkpoints_show),
    (["checkpoints", "reset", "books", "--all"], checkpoints.checkpoints_reset),
    (["workers", "books", "--json"], workers.workers),
    (["push", "books", "http://a.example/"], push.push),
    (["pause", "books"], pause.pause),
    (["resume", "books"], pause.resume),
    (["delayed", "list", "books", "--class", "server"], delayed.delayed_list),
    (["delayed", "retry-now", "books", "--all", "--dry-run"], delayed.delayed_retry_now),
]
MODULES = (flush, dlq, status, workers, push, pause, delayed, checkpoints)


@pytest.mark.parametrize(("argv", "func"), COMMANDS, ids=lambda v: getattr(v, "__name__", ""))
def test_each_subcommand_runs_its_own_function(argv, func):
    args = cli.build_parser().parse_args(["--prefix", "shop", *argv])
    assert args.func.load() is func
    assert (args.spider, args.prefix) == ("books", "shop")


def test_every_subcommand_is_reachable():
    reached = {func for _argv, func in COMMANDS}
    commands = {
        value
        for module in MODULES
        for name, value in vars(module).items()
        if inspect.iscoroutinefunction(value)
        and not name.startswith("_")
        and value.__module__ == module.__name__
        and list(inspect.signature(value).parameters) == ["queue", "args"]
    }
    assert commands == reached


def test_a_group_without_a_subcommand_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.build_parser().parse_args(["dlq", "books"])
    assert exit_.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_ids_are_accepted_after_options_too():
    args = cli.parse(["dlq", "purge", "books", "--yes", "17", "18"])
    assert (args.ids, args.yes) == (["17", "18"], True)
    args = cli.parse(["delayed", "retry-now", "books", "--redis-url", "redis://x", "3"])
    assert (args.ids, args.redis_url) == (["3"], "redis://x")


def test_an_unknown_option_after_ids_is_still_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.parse(["dlq", "purge", "books", "--yes", "17", "--colour"])
    assert exit_.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> list[str]:
    """Every runnable command line's words: ``dlq list``, ``workers``, ..."""
    found = []
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        for name, sub in action.choices.items():
            nested = _commands(sub, f"{prefix}{name} ")
            found += nested or [f"{prefix}{name}"]
    return found


def test_the_reference_documents_every_command():
    text = (Path(__file__).resolve().parent.parent / "docs" / "reference.md").read_text()
    table = text[text.index("## CLI") :]
    missing = [c for c in _commands(cli.build_parser()) if f"| `{c} " not in table]
    assert not missing, f"docs/reference.md's CLI table lacks {missing}"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        # a QA run: `pause ''` wrote ha:{}:paused, a crawl of no name, and said it was done
        (["pause", ""], "argument spider: '' is no spider name"),
        (["status", " "], "argument spider: ' ' is no spider name"),
        # an OverflowError's traceback
        (["dlq", "list", "books", "--since", "9" * 400 + "w"], "argument --since: --since '99"),
        # taken, where nan was refused
        (["metrics", "--timeout", "inf"], "'inf' is not a number of seconds above 0 and at"),
        # a QA run: taken, then every scrape failed with an OverflowError's traceback
        (["metrics", "--timeout", "1e10"], "'1e10' is not a number of seconds above 0 and at"),
        (["items", "books", "--to", "jsonl:x.jl", "--exit-idle", "inf"], "'inf' is not a"),
        # a QA run: the default Redis in silence
        (["--redis-url", "", "status", "books"], "argument --redis-url: '' is no URL: give"),
        # a review: HA_KEY_PREFIX is checked, and --prefix was not
        (["--prefix", "h{1}", "status", "books"], "argument --prefix: 'h{1}' must be non-emp"),
    ],
)
def test_a_bad_argument_is_a_usage_error_naming_it(argv, said, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.parse(argv)
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        # a QA run: the project's HA_DLQ_ARCHIVE_TABLE is taken first (cli/archive.py)
        (["dlq", "archive"], "(default: the project's HA_DLQ_ARCHIVE_TABLE, else"),
        # a QA run: revisit, proxy, dictionary and limit filter too (cli/delayed.py)
        (["delayed", "list"], "or why it waits: gate, limit, revisit, proxy,"),
    ],
)
def test_an_options_help_says_what_it_takes(argv, says, capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args([*argv, "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert says in shown, shown
