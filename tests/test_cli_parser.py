"""The ``scrapy-ha`` command line is dispatched by argparse: each subcommand's parser
carries the function it runs, with the arguments it takes."""

from __future__ import annotations

import pytest

from scrapy_ha import cli

COMMANDS = [
    (["status", "books", "--json"], cli.status),
    (["flush", "books", "--force"], cli.flush),
    (["dlq", "list", "books", "--class", "gone", "--limit", "3"], cli.dlq_list),
    (["dlq", "show", "books", "17"], cli.dlq_show),
    (["dlq", "export", "books", "--domain", "example.com"], cli.dlq_export),
    (["dlq", "requeue", "books", "1", "2"], cli.dlq_requeue),
    (["dlq", "purge", "books", "--all"], cli.dlq_purge),
    (["checkpoints", "list", "books"], cli.checkpoints_list),
    (["checkpoints", "show", "books", "shelf"], cli.checkpoints_show),
    (["checkpoints", "reset", "books", "--all"], cli.checkpoints_reset),
]


@pytest.mark.parametrize(("argv", "func"), COMMANDS, ids=lambda v: getattr(v, "__name__", ""))
def test_each_subcommand_runs_its_own_function(argv, func):
    args = cli.build_parser().parse_args(["--prefix", "shop", *argv])
    assert args.func is func
    assert (args.spider, args.prefix) == ("books", "shop")


def test_every_subcommand_is_reachable():
    reached = {func for _argv, func in COMMANDS}
    commands = {
        value
        for name, value in vars(cli).items()
        if callable(value) and not name.startswith("_") and value.__module__ == cli.__name__
    } - {cli.build_parser, cli.main}
    assert commands | {cli.status} == reached  # status lives in scrapy_ha._cli_status


def test_a_group_without_a_subcommand_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.build_parser().parse_args(["dlq", "books"])
    assert exit_.value.code == 2 and "invalid choice" in capsys.readouterr().err
