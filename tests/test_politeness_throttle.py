"""A crawl-wide rate with AutoThrottle on (docs/scaling.md: "AutoThrottle can stay on"):
AutoThrottle starts each worker's download slot at a delay of seconds
(``AUTOTHROTTLE_START_DELAY``) and lowers it as the site answers fast. A worker handed its
domain's requests to the downloader at their start times whatever the slot held, so they
queued in the slot behind its delay, and the slot sent its queue back to back once the
delay had fallen to about the site's latency: 11 and 12 starts of one worker within half
a second at a rate of 5 (14 to 22 in a second, all workers together)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import TYPE_CHECKING

from tests.test_politeness_crawl import (  # noqa: F401, F811 (a fixture)
    DEADLINE,
    RATE_TOLERANCE,
    counting_site,
)
from tests.test_politeness_stall import SPIDER

if TYPE_CHECKING:
    from pathlib import Path

#: The domain's rate (starts per second, crawl-wide), the pages of its tree, the workers.
RATE, PAGES, WORKERS = 5.0, 60, 2
#: Starts of one worker a half-second window may hold: a worker whose slot sent a request
#: late catches up at 4/3 of its pace at most (StartTimes.CATCH_UP), plus the jitter the
#: crawl-wide test allows.
MOST_IN_HALF_A_SECOND = math.ceil(RATE * 4 / 3 / 2) + RATE_TOLERANCE


def most_in(starts: list[float], seconds: float) -> int:
    starts = sorted(starts)
    return max(sum(1 for t in starts[i:] if t < s + seconds) for i, s in enumerate(starts))


def test_autothrottle_does_not_send_a_workers_queue_at_once(
    tmp_path: Path,
    redis_url,
    counting_site,  # noqa: F811
):
    site = counting_site(PAGES)
    spider = tmp_path / "stall.py"
    spider.write_text(SPIDER % {"stall": 0})  # (no stall: /p/5 sleeps 0 s)
    args = [sys.executable, "-m", "scrapy.cmdline", "runspider", str(spider)]
    args += ["-a", f"root=http://localhost:{site.port}/p/0", "-s", "LOG_LEVEL=INFO"]
    settings = {
        "ADDONS": '{"scrapy_ha.Addon": 0}',
        "REDIS_URL": redis_url,
        "TELNETCONSOLE_ENABLED": "False",
        "HA_DOMAIN_LIMITS": json.dumps({"localhost": {"rate": RATE}}),
        "HA_IDLE_TIMEOUT": "2",
        "AUTOTHROTTLE_ENABLED": "True",
        "AUTOTHROTTLE_START_DELAY": "3",
    }
    for key, value in settings.items():
        args += ["-s", f"{key}={value}"]
    procs = []
    for n in range(WORKERS):
        with (tmp_path / f"w{n}.log").open("wb") as out:
            own = [*args, "-s", f"USER_AGENT=w{n}"]  # the site tells the workers apart
            procs.append(subprocess.Popen(own, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT))
    try:
        for proc in procs:
            proc.wait(timeout=DEADLINE)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert all(p.returncode == 0 for p in procs), (tmp_path / "w0.log").read_text()[-3000:]
    served = {path: n for (host, path), n in site.hits.items() if host == "localhost"}
    assert served == {f"/p/{n}": 1 for n in range(PAGES)}  # nothing lost, nothing repeated
    bursts = {agent: most_in(starts, 0.5) for agent, starts in site.agents.items()}
    print("most in a second:", site.most_in_a_second("localhost"), "a worker's in 0.5 s:", bursts)
    assert max(bursts.values()) <= MOST_IN_HALF_A_SECOND, bursts
