"""What `scrapy-ha flush` says it deletes and keeps: a sharded crawl's shard count goes with
the flush, so the command it names to delete the checkpoints it kept must say the count (a
QA run: `checkpoints reset SPIDER --all`, as the flush said, answered "no such crawl", and
`checkpoints list` too); and the items no sink consumed yet, which it deletes, are listed."""

from __future__ import annotations

import re
import shlex
from typing import TYPE_CHECKING

import pytest

from tests.test_checkpoints import run_paged
from tests.test_cli import scrapy_ha

if TYPE_CHECKING:
    from pathlib import Path

    import redis

    from tests.conftest import Site

pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


def test_flush_of_a_sharded_crawl_names_a_reset_that_works(
    redis_url: str, redis_client: redis.Redis, site_factory: type[Site], tmp_path: Path
) -> None:
    site = site_factory("--pages", "3", "--per-page", "2")
    worker = run_paged(
        redis_url,
        site.url,
        tmp_path / "items.jl",
        tmp_path / "crawl.log",
        HA_SHARDS="3",
        SCHEDULER_PERSIST="True",  # the crawl keeps its keys: flush is what clears them
    )
    assert worker.wait(timeout=120) == 0, (tmp_path / "crawl.log").read_text()[-3000:]
    assert redis_client.keys("ha:{paged:*}:cp:*"), "the finished task's checkpoint"

    flushed = scrapy_ha("--redis-url", redis_url, "flush", "paged", "--yes")
    assert flushed.returncode == 0, flushed.stderr
    assert redis_client.get("ha:{paged}:shards") is None  # the count went with the crawl
    named = re.search(r"`(scrapy-ha checkpoints reset [^`]*)`", flushed.stdout)
    assert named, flushed.stdout
    words = shlex.split(named.group(1))[1:]
    assert "--shards" in words and words[words.index("--shards") + 1] == "3", words

    listed = scrapy_ha("--redis-url", redis_url, "checkpoints", "list", "paged", "--shards", "3")
    assert listed.returncode == 0, listed.stderr
    assert "done" in listed.stdout, listed.stdout
    reset = scrapy_ha("--redis-url", redis_url, *words, "--yes")
    assert reset.returncode == 0, reset.stderr
    assert redis_client.keys("ha:*") == []


def test_flush_names_the_items_no_sink_has_consumed(
    redis_url: str, site_factory: type[Site], tmp_path: Path
) -> None:
    """A QA run: `flush --dry-run` (and its confirmation) listed the dead letters and the
    fingerprints, not the 70 items a declared sink had not consumed, which it deletes."""
    site = site_factory("--pages", "2", "--per-page", "3")
    sink = f"jsonl:{tmp_path / 'sink.jl'}"
    declared = scrapy_ha("--redis-url", redis_url, "items", "paged", "--to", sink, "--declare")
    assert declared.returncode == 0, declared.stderr
    worker = run_paged(
        redis_url, site.url, tmp_path / "items.jl", tmp_path / "crawl.log", HA_ITEMS="outbox"
    )
    assert worker.wait(timeout=120) == 0, (tmp_path / "crawl.log").read_text()[-3000:]
    dry = scrapy_ha("--redis-url", redis_url, "flush", "paged", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert re.search(r"items not consumed by every sink yet .*: 6\b", dry.stdout), dry.stdout
