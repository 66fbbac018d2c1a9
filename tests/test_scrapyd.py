"""scrapyd: deploy the example project, run two jobs of one spider, cancel one mid-crawl;
the other finishes with nothing lost."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlencode
from urllib.request import urlopen

import pytest

from scrapy_ha.demo import harness
from tests.conftest import free_port
from tests.test_crash import check_nothing_lost, count_lines

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def api(url: str, endpoint: str, **params: str | list[str]) -> dict:
    """POST to scrapyd's JSON API (GET for the .json endpoints that read)."""
    query = urlencode(params, doseq=True)
    if endpoint in ("listjobs.json", "daemonstatus.json"):
        with urlopen(f"{url}/{endpoint}?{query}", timeout=30) as r:
            return dict(json.load(r))
    with urlopen(f"{url}/{endpoint}", data=query.encode(), timeout=30) as r:
        return dict(json.load(r))


@pytest.fixture
def scrapyd(tmp_path, request):
    """A scrapyd on loopback; a test parametrized indirectly adds lines to its
    ``[scrapyd]`` section (``{home}``: its directory)."""
    port = free_port()
    home = tmp_path / "scrapyd"
    home.mkdir()
    extra = getattr(request, "param", "").format(home=home)
    (home / "scrapyd.conf").write_text(
        f"[scrapyd]\nbind_address = 127.0.0.1\nhttp_port = {port}\npoll_interval = 0.5\n"
        f"eggs_dir = {home}/eggs\nlogs_dir = {home}/logs\ndbs_dir = {home}/dbs\n{extra}"
    )
    # its own process group: stopping it stops the jobs it runs too, pass or fail
    proc = harness.spawn(
        [str(BIN / "scrapyd")], cwd=home, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            api(url, "daemonstatus.json")
            break
        except OSError:
            assert time.monotonic() < deadline, "scrapyd did not start"
            time.sleep(0.2)
    try:
        yield url, home
    finally:
        harness.stop(proc)


def deploy(url: str, tmp_path: Path) -> None:
    project = tmp_path / "project"
    shutil.copytree(
        ROOT / "example_project",
        project,
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
    )
    cfg = (project / "scrapy.cfg").read_text().replace("http://127.0.0.1:6800/", url + "/")
    (project / "scrapy.cfg").write_text(cfg)
    result = subprocess.run(
        [str(BIN / "scrapyd-deploy"), "-p", "catalogue"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert '"status": "ok"' in result.stdout + result.stderr, result.stdout + result.stderr


def test_two_jobs_one_cancelled_the_other_finishes(scrapyd, redis_url, site_factory, tmp_path):
    url, home = scrapyd
    deploy(url, tmp_path)
    pages, per_page = 60, 20
    site = site_factory(
        "--pages", str(pages), "--per-page", str(per_page), "--delay", "0.01", "--chains", "4"
    )
    items = tmp_path / "items.jl"
    settings = [
        f"REDIS_URL={redis_url}",
        f"ITEMS_FILE={items}",
        "HA_IDLE_TIMEOUT=2",
        "HA_LEASE_TIME=3",
        "HA_LEASE_RENEW_INTERVAL=1",
        "HA_HEARTBEAT_TTL=3",
        "HA_RECLAIM_INTERVAL=1",
        "CONCURRENT_REQUESTS=8",
    ]
    jobs = [
        api(
            url,
            "schedule.json",
            project="catalogue",
            spider="catalogue",
            base_url=site.url,
            setting=settings,
        )["jobid"]
        for _ in range(2)
    ]
    deadline = time.monotonic() + 120
    while count_lines(items) < 300:
        assert time.monotonic() < deadline, "the jobs did not start crawling"
        time.sleep(0.1)
    assert api(url, "cancel.json", project="catalogue", job=jobs[0])["status"] == "ok"
    while True:
        finished = {j["id"] for j in api(url, "listjobs.json", project="catalogue")["finished"]}
        if set(jobs) <= finished:
            break
        assert time.monotonic() < deadline + 120, "the jobs did not finish"
        time.sleep(0.5)
    # Cancel sends SIGINT: the job finishes what it has in flight and releases the rest, so
    # no page needs crawling twice (the site counts); allow one unclean stop's worth.
    check_nothing_lost(items, pages * per_page, site.hits(), bound=4 * 8)
    logs = {
        job: (home / "logs" / "catalogue" / "catalogue" / f"{job}.log").read_text() for job in jobs
    }
    assert "'finish_reason': 'shutdown'" in logs[jobs[0]]
    assert "'finish_reason': 'finished'" in logs[jobs[1]]
    for job in jobs:  # the worker id names the scrapyd job, once: host:pid:job:random
        startup = next(line for line in logs[job].splitlines() if "scrapy-ha" in line)
        assert re.search(rf", worker [^:\s]+:\d+:{job}:[0-9a-f]{{6}}$", startup), startup
        # the example deployed as the README says warns of nothing (its proxy session
        # template, set without a proxy, was said to do nothing in every job's log)
        assert "[scrapy_ha.config.known] WARNING" not in logs[job], logs[job]


@pytest.mark.parametrize("scrapyd", ["jobs_dir = {home}/jobs\n"], indirect=True)
def test_a_node_with_jobs_dir_is_named_as_the_cause_of_the_refused_jobdir(scrapyd, tmp_path):
    """scrapyd's ``jobs_dir`` gives every job a ``JOBDIR``, over the job's own settings: the
    refusal told the operator to pass ``-s JOBDIR=``, which scrapyd overrides
    (``-d setting=JOBDIR=`` on schedule.json was refused all the same)."""
    url, home = scrapyd
    deploy(url, tmp_path)
    job = api(
        url,
        "schedule.json",
        project="catalogue",
        spider="catalogue",
        setting=["JOBDIR=", "REDIS_URL=redis://127.0.0.1:1/0", "HA_START_TIMEOUT=0"],
    )["jobid"]
    deadline = time.monotonic() + 120
    while job not in {j["id"] for j in api(url, "listjobs.json", project="catalogue")["finished"]}:
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(0.5)
    log = (home / "logs" / "catalogue" / "catalogue" / f"{job}.log").read_text()
    (refused,) = [line for line in log.splitlines() if "cannot be used with" in line]
    assert "jobs_dir" in refused and "scrapyd.conf" in refused, refused
