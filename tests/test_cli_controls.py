"""What the CLI prints comes from sites and spiders (a failure's reason, a URL, a class):
characters a terminal acts on are printed escaped (``\\u001b``), so that a dead letter whose
reason holds an escape sequence cannot clear the operator's screen, retitle the window or
hide what follows (codec/log_masking.py ``visible``). Before, ``dlq list`` wrote them raw.
JSON output keeps its values (the escape means the same character in a JSON string), and
``status --watch`` still moves the cursor on a terminal."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import time

from scrapy_ha.keys import Keys
from tests.cli_seed import SCRAPY_HA, dead_letters, scrapy_ha

HOSTILE = "HTTP 404 \x1b]0;pwned\x07\x1b[2J\u202egnp.exe\x9b31m"


def _hostile_dead_letter(redis_url: str, redis_client) -> None:
    dead_letters(redis_url, "evil", [("http://a.test/1", "gone", 404)])
    keys = Keys("ha", "evil")
    (entry,) = redis_client.hkeys(keys.dead_info)
    info = json.loads(redis_client.hget(keys.dead_info, entry))
    info.update(reason=HOSTILE, **{"class": "gone\x1b[31m"})
    redis_client.hset(keys.dead_info, entry, json.dumps(info))


def test_dlq_list_prints_a_reasons_escape_sequences_escaped(redis_url, redis_client):
    _hostile_dead_letter(redis_url, redis_client)
    listed = scrapy_ha("dlq", "list", "evil", "--redis-url", redis_url)
    assert listed.returncode == 0, listed.stderr
    for raw in ("\x1b", "\x07", "\u202e", "\x9b"):
        assert raw not in listed.stdout, listed.stdout
    # cut at 40, not inside the escape that begins at the 39th character (a lone "\\")
    assert "HTTP 404 \\u001b]0;pwned\\u0007\\u001b[2J…  " in listed.stdout
    assert "gone\\u001b[31m" in listed.stdout
    # escaped, then cut: the URL column stays where the header puts it (escaped after the
    # cut, the reason's 40 columns took 60 and pushed the URL out of its column)
    header, row = listed.stdout.splitlines()[:2]
    assert row.index("http://a.test/1") == header.index("URL"), listed.stdout
    exported = scrapy_ha("dlq", "export", "evil", "--redis-url", redis_url)
    (line,) = exported.stdout.splitlines()
    assert "\x1b" not in line and json.loads(line)["reason"] == HOSTILE  # the value kept


def test_status_watch_on_a_terminal_still_draws_in_place(redis_url, redis_client):
    redis_client.hset(Keys("ha", "books").stats, mapping={"enqueued": 3, "acked": 1})
    master, slave = pty.openpty()
    command = [SCRAPY_HA, "--redis-url", redis_url, "status", "books", "--watch", "0.2"]
    proc = subprocess.Popen(
        command, stdout=slave, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
    )
    os.close(slave)
    out = b""
    deadline = time.monotonic() + 60
    try:
        while out.count(b"totals") < 2:
            assert proc.poll() is None and time.monotonic() < deadline, out
            if select.select([master], [], [], 0.5)[0]:
                out += os.read(master, 65536)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        os.close(master)
    assert out.startswith(b"\x1b[2J\x1b[H"), out[:40]  # cleared once, then drawn from home
    assert b"\x1b[K" in out and b"\x1b[J" in out and b"\\u001b" not in out


def test_dlq_list_keeps_one_row_per_entry_with_long_classes_and_multiline_reasons(
    redis_url, redis_client
):
    """Before: a reason holding newlines (a traceback's) broke its row in several lines,
    and a class longer than 12 characters pushed its row's columns out of line."""
    rows = [(f"http://a.test/{n}", cls, 500) for n, cls in enumerate(["server", "x" * 30])]
    dead_letters(redis_url, "wide", rows)
    keys = Keys("ha", "wide")
    for entry in redis_client.hkeys(keys.dead_info):
        info = json.loads(redis_client.hget(keys.dead_info, entry))
        info["reason"] = "Traceback (most recent call last):\n  File x\nValueError: bad"
        redis_client.hset(keys.dead_info, entry, json.dumps(info))
    listed = scrapy_ha("dlq", "list", "wide", "--redis-url", redis_url).stdout.splitlines()
    header, *entries, total = listed
    assert len(entries) == 2, listed
    starts = {line.index("http://") for line in entries}
    assert len(starts) == 1 and header.index("URL") == starts.pop(), listed
    assert all("Traceback (most recent call last): File…" in line for line in entries)
    assert "x" * 23 + "…" in entries[1] and "x" * 25 not in entries[1]


def test_a_watched_frame_is_one_write_with_its_text_escaped():
    """A review's finding on the first version: a frame written line by line (48 writes)
    reached a terminal in pieces, as a line-buffered stream flushes at each newline."""
    from scrapy_ha.cli.watch import draw

    class Terminal:
        def __init__(self) -> None:
            self.raw: list[str] = []

        def write(self, text: str) -> int:
            raise AssertionError(f"not raw: {text!r}")

        def write_raw(self, text: str) -> int:
            self.raw.append(text)
            return len(text)

    out = Terminal()
    draw(out, ["books at 10:00", "reason \x1b[2J"], in_place=True, last=False)  # type: ignore[arg-type]
    (frame,) = out.raw
    assert frame.startswith("\x1b[H") and frame.endswith("\x1b[J")
    assert "reason \\u001b[2J\x1b[K\n" in frame


def test_a_carriage_return_is_printed_as_it_is():
    """A CSV line a project's pipeline prints ends with \\r\\n (review)."""
    from scrapy_ha.codec.log_masking import visible

    assert visible("a,b\r\n") == "a,b\r\n" and visible("\x1b") == "\\u001b"
