"""Real ``scrapy crawl`` processes: waiting costs nothing, failing to start is one line.

A one-page crawl closes as soon as it is finished (never waiting out the idle timeout), a
worker waiting for a retry due later uses next to no CPU (read from the kernel), and a worker
that cannot start says why in one ERROR line and exits non-zero.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy_ha.keys import Keys

if TYPE_CHECKING:
    import redis

SPIDER = """
import scrapy


class One(scrapy.Spider):
    name = "one"

    def __init__(self, url="", **kwargs):
        super().__init__(**kwargs)
        self.start_urls = [url]

    def parse(self, response):
        yield {"url": response.url}
"""
#: Seconds a waiting worker is watched: long enough to average out the 5 s engine heartbeat.
WATCH = 6.0


def crawl(tmp_path: Path, url: str, **settings: str) -> subprocess.Popen[bytes]:
    spider = tmp_path / "one.py"
    spider.write_text(SPIDER)
    args = [
        sys.executable,
        "-m",
        "scrapy.cmdline",
        "runspider",
        str(spider),
        "-a",
        f"url={url}",
        "-s",
        "LOG_LEVEL=INFO",
        "-s",
        "REMOTE_CONTROL_ENABLED=False",
    ]
    for name, value in settings.items():
        args += ["-s", f"{name}={value}"]
    with (tmp_path / "log.txt").open("wb") as log:
        return subprocess.Popen(args, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)


def wall_and_cpu(proc: subprocess.Popen[bytes]) -> tuple[float, float, int]:
    started = time.monotonic()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = status
    return time.monotonic() - started, usage.ru_utime + usage.ru_stime, status


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ha(redis_url: str, **extra: Any) -> dict[str, str]:
    return {"ADDONS": '{"scrapy_ha.Addon": 0}', "REDIS_URL": redis_url, **extra}


#: An idle timeout no one-page crawl comes near: a worker that waited it out instead of closing
#: when the crawl was verifiably finished shows it in its log, whatever the machine's load.
LONG_IDLE_TIMEOUT = 60


def test_a_one_page_crawl_closes_as_soon_as_it_is_done(tmp_path, redis_url, site):
    url = site.url + "/item/1"
    for name in ("memory", "ha"):
        (tmp_path / name).mkdir()
    memory = wall_and_cpu(crawl(tmp_path / "memory", url))
    settings = ha(redis_url, HA_IDLE_TIMEOUT=str(LONG_IDLE_TIMEOUT))
    scrapy_ha = wall_and_cpu(crawl(tmp_path / "ha", url, **settings))
    print(
        f"memory scheduler: {memory[0]:.2f} s wall, {memory[1]:.2f} s CPU; "
        f"scrapy-ha: {scrapy_ha[0]:.2f} s wall, {scrapy_ha[1]:.2f} s CPU"
    )
    assert memory[2] == scrapy_ha[2] == 0
    # a lone worker whose crawl is finished (nothing pending, leased or delayed in Redis)
    # closes at once: it does not wait out HA_IDLE_TIMEOUT, which is for live peers
    log = (tmp_path / "ha" / "log.txt").read_text()
    assert "Crawl finished: cleared its working keys" in log
    assert "'finish_reason': 'finished'" in log and "'item_scraped_count': 1" in log
    # (log stamps have 1 s resolution: a worker that waited shows 59 s or more; a one-page
    # crawl on the most loaded machine takes a few seconds, far from half the timeout)
    assert (
        seconds_between(log, "Spider opened", "Closing spider (finished)") < LONG_IDLE_TIMEOUT / 2
    )


def seconds_between(log: str, first: str, second: str) -> float:
    """Seconds between the log lines holding *first* and *second* (1 s resolution)."""
    stamps = {}
    for line in log.splitlines():
        for text in (first, second):
            if text in line and text not in stamps:
                stamps[text] = datetime.strptime(line[:19], "%Y-%m-%d %H:%M:%S")
    return (stamps[second] - stamps[first]).total_seconds()


def test_a_worker_waiting_for_a_retry_uses_next_to_no_cpu(tmp_path, redis_url, redis_client, site):
    settings = ha(redis_url, HA_RETRY_BACKOFF_BASE="60", HA_RETRY_JITTER="0")
    proc = crawl(tmp_path, site.url + "/status/500", **settings)
    try:
        wait_for_delayed(redis_client, proc)
        time.sleep(1)  # let the retry's own work settle
        cpu, started = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(WATCH)
        share = (cpu_seconds(proc.pid) - cpu) / (time.monotonic() - started)
    finally:
        proc.kill()
        proc.wait()
    print(f"CPU while waiting for a retry due in 60 s: {share:.2%} of a core")
    assert proc.returncode == -9, "the worker must wait for its retry, not close"
    assert share < 0.02


def wait_for_delayed(client: redis.Redis, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while not client.zcard(Keys("ha", "one").delayed):
        assert proc.poll() is None, "the worker ended before its retry was delayed"
        assert time.monotonic() < deadline, "no retry was delayed within 60 s"
        time.sleep(0.1)


#: Scrapy's own scheduler with scrapy-ha's retry middleware in place of Scrapy's.
RETRY_ALONE = {
    "DOWNLOADER_MIDDLEWARES": '{"scrapy.downloadermiddlewares.retry.RetryMiddleware": null, '
    '"scrapy_ha.retry.RetryMiddleware": 550}',
}


def test_a_fatal_error_at_start_is_one_line_and_a_failed_exit(tmp_path):
    """A middleware's bad setting too (before: a traceback of ``Task exception was never
    retrieved`` and no finish reason): its middlewares are built before the scheduler, and
    a setting the scheduler reads as well is said once. With Scrapy's own scheduler too."""
    from tests.conftest import free_port

    for name, extra in (
        ("redis", {"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}),
        ("setting", {"HA_LEASE_TIME": "soon"}),
        ("middleware", {"HA_CHECKPOINTS": "True", "HA_CHECKPOINT_ITEMS": "-5"}),
        ("both", {"HA_CHECKPOINTS": "True", "HA_ITEMS": "outbx"}),
    ):
        (tmp_path / name).mkdir()
        # (no Redis there: a scheduler that tried to connect would say so too)
        nobody = f"redis://127.0.0.1:{free_port()}/0"
        settings = ha(nobody, HA_CONNECT_TIMEOUT="1", HA_START_TIMEOUT="0", **extra)
        proc = crawl(tmp_path / name, "http://127.0.0.1:9/", **settings)
        assert proc.wait(120) != 0
        log = (tmp_path / name / "log.txt").read_text()
        errors = [line for line in log.splitlines() if " ERROR: " in line]
        assert len(errors) == 1, log
        assert "scrapy-ha cannot" in errors[0]
        assert "Traceback" not in log
        assert "'finish_reason': 'ha_start_failed'" in log, log[-3000:]
    (tmp_path / "alone").mkdir()
    proc = crawl(tmp_path / "alone", "http://127.0.0.1:9/", **RETRY_ALONE, HA_RETRY_JITTER="2")
    assert proc.wait(120) != 0
    log = (tmp_path / "alone" / "log.txt").read_text()
    errors = [line for line in log.splitlines() if " ERROR: " in line]
    assert len(errors) == 1 and "HA_RETRY_JITTER" in errors[0], log
    assert "Traceback" not in log and "'finish_reason': 'ha_start_failed'" in log, log[-3000:]
