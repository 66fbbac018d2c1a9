"""``scrapy-ha push`` that would make a crawl's Bloom filter whose first layer cannot fit in
what Redis has left of its ``maxmemory`` is refused, naming both sizes, as a worker is at
start: before, the push made the default filter's 36 MB first layer in a 20 MB Redis, said
``1 added``, and every worker of the crawl then failed to start on Redis's OOM refusal.
Real redis-servers, real ``scrapy-ha`` processes in a real project."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests import redis_servers
from tests.scrapy_project import write_project
from tests.test_cli import scrapy_ha

if TYPE_CHECKING:
    from pathlib import Path

SPIDER = 'import scrapy\n\n\nclass K(scrapy.Spider):\n    name = "k"\n'


def test_a_push_is_refused_a_first_layer_redis_has_no_room_for(tmp_path: Path) -> None:
    server = redis_servers.start(tmp_path / "redis", "--maxmemory", "20mb")
    try:
        url = f"redis://127.0.0.1:{server.port}/0"
        push = ("--redis-url", url, "push", "k", "--create", "https://a.example/1")
        default = write_project(tmp_path / "big", "big", SPIDER, "HA_DUPEFILTER = 'bloom'\n")
        done = scrapy_ha(*push, cwd=default)  # 10 M URLs at 1e-6: a 36 MB first layer
        assert done.returncode == 2, done.stdout
        assert "its first layer takes 36." in done.stderr, done.stderr
        assert "maxmemory 20.0 MB" in done.stderr, done.stderr
        assert not server.client().keys("ha:{k}:bloom*")  # nothing made
        assert server.client().info("memory")["used_memory"] < 20 * 2**20
        small = "HA_DUPEFILTER = 'bloom'\nHA_DUPEFILTER_CAPACITY = 100000\n"
        fits = write_project(tmp_path / "small", "small", SPIDER, small)
        done = scrapy_ha(*push, cwd=fits)
        assert done.returncode == 0 and "1 added" in done.stdout, done.stderr
    finally:
        server.kill()


def test_a_push_as_a_user_without_info_skips_the_room_check_saying_so(tmp_path: Path) -> None:
    """The room check reads ``INFO``: a user whose ACL refuses it (``-info``, or ``-@dangerous``
    as a monitoring user's) had every push that would make a Bloom filter refused (``error:
    ... no permissions to run the 'info' command``, exit 2); a worker of that user skips
    the check and crawls (docs/scaling.md), and so does the push, in one line on stderr."""
    server = redis_servers.start(tmp_path / "redis", "--maxmemory", "200mb")
    try:
        admin = server.client()
        small = "HA_DUPEFILTER = 'bloom'\nHA_DUPEFILTER_CAPACITY = 100000\n"
        project = write_project(tmp_path / "small", "small", SPIDER, small)
        for n, rules in enumerate((["-info"], ["-@dangerous"])):
            admin.execute_command(
                "ACL", "SETUSER", f"u{n}", "on", ">pw", "~*", "&*", "+@all", *rules
            )
            url = f"redis://u{n}:pw@127.0.0.1:{server.port}/{n}"
            push = ("--redis-url", url, "push", "k", "--create", f"https://a.example/{n}")
            done = scrapy_ha(*push, cwd=project)
            assert done.returncode == 0 and "1 added" in done.stdout, done.stderr
            assert "may not run INFO" in done.stderr and "room" in done.stderr, done.stderr
            assert len(done.stderr.strip().splitlines()) == 1, done.stderr
            assert server.client(db=n).exists("ha:{k}:bloom")  # the filter made, as a worker's
    finally:
        server.kill()


def test_a_worker_refused_for_room_leaves_no_claim_behind(tmp_path: Path) -> None:
    """A worker refused at start because its filter's first layer cannot fit claimed the
    crawl's kind first (``ha:{S}:filter``, ``bloom``) and left it behind an empty crawl: a
    push of the project with the exact set, the fix the refusal leaves open, was then
    refused as one run outside the project (``none of its shards has made one yet``)."""
    from tests.scrapy_project import crawl

    server = redis_servers.start(tmp_path / "redis", "--maxmemory", "20mb")
    try:
        url = f"redis://127.0.0.1:{server.port}/0"
        big = write_project(tmp_path / "big", "big", SPIDER, "HA_DUPEFILTER = 'bloom'\n")
        worker = crawl(big, "k", tmp_path / "worker.log", settings={"REDIS_URL": url})
        assert worker.wait(timeout=120) == 1
        said = (tmp_path / "worker.log").read_text()
        assert "its first layer takes 36." in said and "ha_start_failed" in said, said[-3000:]
        assert server.client().get("ha:{k}:filter") is None  # nothing claimed
        exact = write_project(tmp_path / "set", "exact", SPIDER, "HA_DUPEFILTER = 'set'\n")
        push = ("--redis-url", url, "push", "k", "--create", "https://a.example/1")
        done = scrapy_ha(*push, cwd=exact)
        assert done.returncode == 0 and "1 added" in done.stdout, done.stderr
        assert server.client().get("ha:{k}:filter") == b"set"
    finally:
        server.kill()
