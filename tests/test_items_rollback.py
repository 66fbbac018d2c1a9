"""A sink whose Redis comes back from a snapshot older than its consumer group.

With RDB snapshots alone a crash of Redis takes the crawl back to its last snapshot; one
taken before the sink's group was made comes back without the stream and the group. The
consumer stops (it does not make them again behind what may be a flush) and used to name a
``scrapy-ha flush`` alone, which no one had run (a QA run: ``save 60 1``, Redis SIGKILLed
45 s into the crawl). Started again, it gets the items committed since. Real servers.
"""

from __future__ import annotations

import subprocess
import time
from typing import TYPE_CHECKING

from tests import redis_servers
from tests.cli_seed import SCRAPY_HA, _run, scrapy_ha
from tests.test_items_sinks import fill, lines

if TYPE_CHECKING:
    from pathlib import Path


def test_a_sink_whose_redis_came_back_older_says_so_and_gets_the_items_when_started_again(
    tmp_path: Path,
):
    server = redis_servers.start(tmp_path / "redis", "--save", "3600 1")
    url = f"redis://127.0.0.1:{server.port}/0"
    try:
        server.client().save()  # the snapshot: from before the crawl and its sink
        _run(fill(url, range(1, 3)))
        path = tmp_path / "i.jl"
        base = [SCRAPY_HA, "items", "s", "--to", f"jsonl:{path}", "--redis-url", url]
        proc = subprocess.Popen(base, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not (path.exists() and lines(path) == [1, 2]):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        server.kill()  # SIGKILL: Redis starts again from the snapshot
        server = redis_servers.start(tmp_path / "redis", "--save", "3600 1", port=server.port)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 1, (out, err)
        assert "error: the item stream of s was deleted while this consumer ran" in err
        assert "Redis restarted from an older snapshot" in err, err
        _run(fill(url, range(3, 5)))  # the crawl goes on: its pages are done again
        again = scrapy_ha(
            "items", "s", "--to", f"jsonl:{path}", "--redis-url", url, "--exit-idle", "0.5"
        )
        assert again.returncode == 0, again.stderr
        assert lines(path) == [1, 2, 3, 4]
    finally:
        server.kill()
