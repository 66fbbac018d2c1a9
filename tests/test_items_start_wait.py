"""`scrapy-ha items` started while its Redis is not there yet (a container up before Redis,
a Redis restarting) waits for it, as a worker does, up to HA_START_TIMEOUT: real consumer
processes, a real redis-server started on their port after them (or never). It exited at
once with code 2 ("cannot reach Redis"), and its sink got nothing until someone started it
again. The commands that run once still fail at once."""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest
import redis.asyncio
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.cli.items_start import wait_for_redis
from scrapy_ha.cli.runner import _client_reached
from scrapy_ha.config.start_wait import StartWaitConfig
from scrapy_ha.demo.harness import free_port, wait_for
from scrapy_ha.store.start_wait import Halt, StartWait
from tests.test_crash import wait_for_log
from tests.test_items_sink_kills import fill
from tests.test_start_stopped import ended
from tests.test_start_wait import WAITING, started_after_waits

if TYPE_CHECKING:
    from pathlib import Path

#: Items put in the stream once the consumer runs.
ITEMS = 150
#: Seconds a consumer stopped during its wait may take to exit (a loaded machine).
STOPPED_WITHIN = 15


def consumer(url: str, to: str, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    """``scrapy-ha items s --to TO`` (outside any project), its output in *log*."""
    args = [sys.executable, "-m", "scrapy_ha.cli.cmdline", "items", "s", "--to", to]
    args += ["--redis-url", url, *extra]
    with log.open("ab") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=log.parent)


def stop(proc: subprocess.Popen[bytes], sig: int) -> int:
    proc.send_signal(sig)
    return ended(proc)


def test_a_consumer_started_before_its_redis_waits_for_it_then_consumes_each_item_once(
    tmp_path: Path,
) -> None:
    port = free_port()
    url = f"redis://:hunter2@127.0.0.1:{port}/0"
    path, log = tmp_path / "items.jl", tmp_path / "consumer.log"
    early = consumer(url, f"jsonl:{path}", log, "--create")  # HA_START_TIMEOUT: 60 s
    server = None
    try:
        server = started_after_waits(log, early, tmp_path, port)
        wait_for_log(log, "consuming the items of s", early)
        fill(url, ITEMS)
        wait_for(lambda: path.exists() and path.read_text().count("\n") >= ITEMS, "items", 60)
        assert early.poll() is None  # still running: a service, not a one-shot
        code = stop(early, signal.SIGTERM)
    finally:
        if early.poll() is None:
            early.kill()
            early.wait()
        if server is not None:
            server.kill()
    text = log.read_text()
    assert code == 0, text[-3000:]
    ids = [json.loads(line)["id"] for line in path.read_text().splitlines()]
    assert sorted(ids) == list(range(1, ITEMS + 1))  # each once
    assert f"Redis at redis://:***@127.0.0.1:{port}/0 {WAITING} (ConnectionError" in text
    assert f"consumed {ITEMS} item(s)" in text and "hunter2" not in text


@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"]
)
def test_a_consumer_stopped_while_it_waits_for_redis_exits_at_once_saying_so(
    tmp_path: Path, sig: int, code: int
) -> None:
    port = free_port()
    log = tmp_path / "consumer.log"
    waiting = consumer(f"redis://:hunter2@127.0.0.1:{port}/0", "jsonl:x.jl", log)
    wait_for_log(log, f"{WAITING} (", waiting)
    assert stop(waiting, sig) == code  # 128 + the signal, as a shell reports it
    last = log.read_text().strip().splitlines()[-1]
    assert last.startswith(f"interrupted by {signal.Signals(sig).name}: scrapy-ha stopped before")
    assert f"redis://:***@127.0.0.1:{port}/0" in last and "nothing was consumed" in last


def test_a_consumer_whose_redis_never_comes_fails_after_the_start_timeout(tmp_path: Path) -> None:
    log = tmp_path / "consumer.log"
    url = f"redis://127.0.0.1:{free_port()}/0"
    alone = consumer(url, "jsonl:x.jl", log, "-s", "HA_START_TIMEOUT=1")
    assert alone.wait(timeout=60) == 2, log.read_text()
    text = log.read_text()
    assert len(text.split(WAITING)) >= 3  # waited, trying again
    assert f"error: scrapy-ha cannot reach Redis at {url} within HA_START_TIMEOUT=1s" in text


@pytest.mark.parametrize("action", ["--declare", "--aside"])
def test_a_one_shot_items_action_still_fails_at_once(tmp_path: Path, action: str) -> None:
    log = tmp_path / "consumer.log"
    url = f"redis://127.0.0.1:{free_port()}/0"
    once = consumer(url, "jsonl:x.jl", log, action)
    assert once.wait(timeout=60) == 2, log.read_text()
    text = log.read_text()
    assert WAITING not in text and f"error: cannot reach Redis at {url} within 5 s" in text


@deferred_f_from_coro_f
async def test_the_consumers_wait_puts_back_the_clis_own_ctrl_c_handler(redis_url: str) -> None:
    """The wait's handlers were removed with ``loop.remove_signal_handler``, which puts
    Python's default SIGINT handler back, not the CLI's (which makes Ctrl-C interrupt a
    command where it runs: ``cmdline._interrupt_where_it_runs``)."""

    def clis_own(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGINT, clis_own)
    config = Settings({"REDIS_URL": redis_url})
    try:
        reach = functools.partial(_client_reached, config, redis_url)
        client = await wait_for_redis(config, redis_url, reach)
        await client.aclose()
        assert signal.getsignal(signal.SIGINT) is clis_own
    finally:
        signal.signal(signal.SIGINT, before)


@deferred_f_from_coro_f
async def test_a_stop_as_redis_first_answers_does_not_say_redis_went_away(redis_url: str) -> None:
    """A stop that lands as the first attempt succeeds (the consumer then closes its client
    and says why): it said "to answer again (it had answered, then went away ...)"."""
    halt = Halt()
    wait = StartWait(StartWaitConfig(), redis_url, halt)
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await wait.run(client.ping)
        halt.stop()
        message = str(wait.stopped())
    finally:
        await client.aclose()
    assert "went away" not in message and "again" not in message, message
    assert f"Redis at {redis_url}" in message and "after Redis answered" in message
