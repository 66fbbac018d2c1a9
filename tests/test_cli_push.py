"""``scrapy-ha push``: requests added from the shell are crawled by a real worker with their
callback, errback, meta and priority, through the crawl's own dupefilter."""

from __future__ import annotations

import json
import secrets
from typing import Any

import pytest
import scrapy
from scrapy.core.engine import ExecutionEngine
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.cli.push import BATCH, BadLine, parse_line
from scrapy_ha.codec.compact import dictionary_id
from scrapy_ha.keys import Keys
from tests import backqueues
from tests.cli_seed import scrapy_ha
from tests.test_retry_crawl import FAST_RETRIES


class PushedSpider(scrapy.Spider):
    """No start requests of its own: it crawls what an operator pushed."""

    name = "pushed"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seen: list[tuple[str, str, Any]] = []

    async def start(self) -> Any:
        return
        yield

    def parse(self, response: Any) -> None:
        self.seen.append(("parse", response.url, response.meta.get("tag")))

    def parse_item(self, response: Any) -> None:
        self.seen.append(("parse_item", response.url, response.meta.get("tag")))

    def on_error(self, failure: Any) -> None:
        self.seen.append(("on_error", failure.request.url, failure.request.meta.get("tag")))


def push(redis_url: str, *requests: str, stdin: str | None = None) -> Any:
    kwargs: dict[str, Any] = {"input": stdin, "stdin": None} if stdin is not None else {}
    return scrapy_ha("push", "pushed", *requests, "--create", "--redis-url", redis_url, **kwargs)


@deferred_f_from_coro_f
async def test_pushed_requests_are_crawled_with_their_callbacks_and_meta(
    redis_url, redis_client, site, monkeypatch
):
    monkeypatch.setattr(ExecutionEngine, "_SLOT_HEARTBEAT_INTERVAL", 0.2)
    item = json.dumps({"url": f"{site.url}/item/2", "callback": "parse_item", "meta": {"tag": "x"}})
    gone = json.dumps({"url": f"{site.url}/status/404", "errback": "on_error", "priority": 3})
    first = push(redis_url, f"{site.url}/item/1", item, gone)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "pushed 3 requests to pushed: 3 added, 0 filtered (seen before)"
    again = "\n".join(
        [f"{site.url}/item/1", item, json.dumps({"url": f"{site.url}/item/1", "dont_filter": True})]
    )
    second = push(redis_url, "-", stdin=again + "\n")
    assert second.stdout.strip() == "pushed 3 requests to pushed: 1 added, 2 filtered (seen before)"
    assert backqueues.count(redis_client, Keys("ha", "pushed")) == 4

    crawler = get_crawler(PushedSpider, {**FAST_RETRIES, "REDIS_URL": redis_url})
    await crawler.crawl_async()
    assert sorted(crawler.spider.seen) == sorted(
        [
            ("parse", f"{site.url}/item/1", None),
            ("parse", f"{site.url}/item/1", None),
            ("parse_item", f"{site.url}/item/2", "x"),
            ("on_error", f"{site.url}/status/404", None),
        ]
    )


X = '{"url": "http://a.example/x", '
BAD_LINES = [
    (X + '"callback": "os.system"}', '"callback" must be the name of a spider method'),
    (X + '"callback": "_set_crawler"}', "not starting with '_')"),
    (X + '"colour": "red"}', "unknown field(s) colour"),
    ('{"url": 5}', '"url" must be a string, not the number 5'),
    ('{"method": "GET"}', 'needs a "url"'),
    ("{not json", "not JSON"),
    ("a.example/x", "Missing scheme"),
    # each field as JSON gives it: wrong types are named, never coerced
    (X + '"dont_filter": "false"}', '"dont_filter" must be true or false, not the string "false"'),
    (X + '"dont_filter": 0}', '"dont_filter" must be true or false, not the number 0'),
    (X + '"method": null}', '"method" must be an HTTP method such as GET or POST, not null'),
    (X + '"method": "GE T"}', 'not the string "GE T"'),
    (X + '"method": 1}', '"method" must be an HTTP method such as GET or POST, not the number'),
    (X + '"priority": 2.9}', '"priority" must be a whole number from -4095 to 4095'),
    (X + '"priority": 2.0}', "not the number 2.0"),
    (X + '"priority": "3"}', 'not the string "3"'),
    (X + '"priority": true}', '"priority" must be a whole number from -4095 to 4095 (the range'),
    (X + '"priority": 5000}', "not the number 5000"),
    (X + '"meta": ["a"]}', '"meta" must be an object, not an array ["a"]'),
    (X + '"meta": null}', '"meta" must be an object, not null (leave the field out'),
    (X + '"headers": {"X-A": 1}}', '"headers" must be an object whose values are strings'),
    (X + '"headers": {"X-A": ["a", 2]}}', 'not an object {"X-A": ["a", 2]}'),
    (X + '"headers": "X-A: 1"}', 'not the string "X-A: 1"'),
    (X + '"body": {"a": 1}}', '"body" must be a string, not an object {"a": 1}'),
    (X + '"body": 5}', '"body" must be a string, not the number 5'),
    (X + '"callback": null}', '"callback" must be the name of a spider method'),
    # the worker would crawl it once and not revisit it, said in its log alone (before)
    (X + '"meta": {"ha_revisit": "hourly"}}', "meta['ha_revisit']='hourly' must be seconds"),
    (X + '"meta": {"ha_revisit": 0.001}}', "a finite number from"),
    (X + '"meta": {"ha_revisit": [60]}}', "meta['ha_revisit']=[60] must be seconds"),
    (X + '"errback": 5}', '"errback" must be the name of a spider method'),
]


@pytest.mark.parametrize(("line", "says"), BAD_LINES)
def test_a_bad_line_is_named_with_what_to_fix(line, says):
    with pytest.raises(BadLine) as bad:
        parse_line(line, "stdin line 3")
    assert str(bad.value).startswith("stdin line 3: ") and says in str(bad.value)


def test_json_fields_are_taken_as_they_are():
    line = (
        X + '"method": "post", "priority": -3, "dont_filter": false, "body": "a=1", '
        '"headers": {"X-A": "1", "X-B": ["2", "3"]}, "meta": {"n": 1}, "callback": "parse_item"}'
    )
    request, callbacks = parse_line(line, "argument 1")
    assert (request.method, request.priority, request.dont_filter, request.body) == (
        "POST",
        -3,
        False,
        b"a=1",
    )
    assert request.headers.getlist("X-B") == [b"2", b"3"] and request.meta == {"n": 1}
    assert list(callbacks.values()) == ["parse_item"]
    # taken as the worker takes them
    for meta in ('{"ha_revisit": 3600}', '{"ha_revisit": false}', '{"ha_revisit": "60"}'):
        request, _ = parse_line(X + f'"meta": {meta}}}', "argument 1")
        assert request.meta == json.loads(meta)


def test_a_wrongly_typed_field_names_its_line_and_pushes_nothing(redis_url, redis_client):
    lines = [
        X + '"priority": 1}',
        X.replace("/x", "/y") + '"meta": {}}',
        X + '"dont_filter": "false"}',
    ]
    result = push(redis_url, "-", stdin="\n".join(lines) + "\n")
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        'nothing pushed: stdin line 3: "dont_filter" must be true or false, not the string "false"'
    )
    assert result.stdout == ""
    assert not redis_client.exists("ha:{pushed}:ready", "ha:{pushed}:dupefilter")


def test_a_bad_line_pushes_nothing(redis_url, redis_client):
    result = push(redis_url, "http://a.example/fine", BAD_LINES[0][0])
    assert result.returncode == 1
    said = result.stderr.splitlines()  # after a note that no project settings apply here
    assert said[-1].startswith('nothing pushed: argument 2: "callback" must be the name of a')
    assert not redis_client.exists("ha:{pushed}:ready", "ha:{pushed}:dupefilter")


def test_a_file_named_as_a_request_says_how_to_push_its_lines(redis_url, redis_client, tmp_path):
    """A QA run: `scrapy-ha push SPIDER urls.txt` answered `Missing scheme in request url:
    urls.txt`, which did not say that a file's lines are pushed from stdin."""
    urls = tmp_path / "urls.txt"
    urls.write_text("http://a.example/1\n")
    result = push(redis_url, str(urls))
    assert result.returncode == 1
    said = result.stderr.splitlines()[-1]
    assert said.startswith("nothing pushed: argument 1: Missing scheme"), said
    assert f"{urls} is a file: to push its lines, give - and the file on stdin" in said, said
    assert not redis_client.exists("ha:{pushed}:ready")


def test_a_push_that_redis_stops_half_way_says_what_was_pushed(redis_url, redis_client):
    """The second batch holds a request larger than Redis takes in one argument (its
    proto-max-bulk-len, 1 MB here, compacted too): Redis closes the connection after the
    first batch was stored. The command says which lines are in and which are not."""
    small = [json.dumps({"url": f"http://a.example/{i}"}) for i in range(1199)]
    # random, so that compacted (HA_COMPACT_PAYLOADS) it is still over 1 MB
    large = json.dumps({"url": "http://a.example/large", "body": secrets.token_urlsafe(1_200_000)})
    lines = [*small[:BATCH], large, *small[BATCH:]]
    old = redis_client.config_get("proto-max-bulk-len")["proto-max-bulk-len"]
    redis_client.config_set("proto-max-bulk-len", 1024 * 1024)  # the least it takes
    try:
        result = push(redis_url, "-", stdin="\n".join(lines) + "\n")
    finally:
        redis_client.config_set("proto-max-bulk-len", old)
    assert result.returncode == 2
    assert result.stdout == ""
    said = result.stderr.splitlines()[-1]
    assert said.startswith(
        "error: pushed 500 of 1,200 requests to pushed (500 added, 0 filtered), stdin lines 1 "
        "to 500, before Redis failed: "
    ), said
    assert said.endswith(
        "; stdin lines 501 to 1200 were not pushed, or only in part: push them again (the "
        "dupefilter drops those already in; one with dont_filter would be queued twice)"
    ), said
    assert backqueues.count(redis_client, Keys("ha", "pushed")) == BATCH


def test_a_push_stopped_by_ctrl_c_says_what_was_pushed(redis_url, redis_client, tmp_path):
    """As when Redis stops it half-way: the lines stored and those not, so that pushing the
    rest again queues nothing twice (a dont_filter line pushed again is). Before, a Ctrl-C
    said ``interrupted`` alone."""
    import signal
    import subprocess
    import time

    from tests.cli_seed import ROOT, SCRAPY_HA

    lines = tmp_path / "lines.txt"
    n = 400 * BATCH  # pushed for seconds: the Ctrl-C comes between two batches
    lines.write_text("".join(f"http://a.example/{i}\n" for i in range(n)))
    keys = Keys("ha", "pushed")
    args = [SCRAPY_HA, "push", "pushed", "-", "--create", "--redis-url", redis_url]
    with lines.open() as stdin:
        proc = subprocess.Popen(args, cwd=ROOT, stdin=stdin, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 120
            # a second batch in Redis: the first one's reply came (the push said it is in)
            while backqueues.count(redis_client, keys) <= BATCH and proc.poll() is None:
                assert time.monotonic() < deadline, "no second batch pushed"
                time.sleep(0.02)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
    assert proc.returncode == 130, err
    assert err.splitlines()[-1] == "interrupted", err
    said = next((line for line in err.splitlines() if line.startswith("interrupted: ")), err)
    assert said.startswith("interrupted: pushed "), err  # before: "interrupted" alone
    pushed = int(said.split()[2].replace(",", ""))
    assert BATCH <= pushed < n, said
    assert said.startswith(f"interrupted: pushed {pushed:,} of {n:,} requests to pushed ("), said
    assert f"stdin lines 1 to {pushed}, before Ctrl-C; stdin lines {pushed + 1} to {n}" in said
    queued = backqueues.count(redis_client, keys)
    assert pushed <= queued <= pushed + BATCH  # the batch under way: in, or in part


@deferred_f_from_coro_f
async def test_pushed_requests_are_compacted_as_a_workers_are(
    redis_url, redis_client, site, monkeypatch
):
    """A QA run: 2,000,000 pushed URLs were stored as plain documents, 124 bytes of Redis a
    95-character URL where a worker's compacted requests take about 40
    (``HA_COMPACT_PAYLOADS``): a push trains the crawl's dictionary from its first lines
    when the crawl has none, and compacts with the crawl's own when it has one."""
    monkeypatch.setattr(ExecutionEngine, "_SLOT_HEARTBEAT_INTERVAL", 0.2)
    keys = Keys("ha", "pushed")
    urls = [f"{site.url}/item/{i % 50 + 1}?n={i}" for i in range(300)]
    first = push(redis_url, "-", stdin="\n".join(urls[:200]) + "\n")
    assert first.returncode == 0, first.stderr
    current = redis_client.hget(keys.dictionaries, "current")
    assert current is not None  # trained from the pushed requests, as a worker trains one
    second = push(redis_url, "-", stdin="\n".join(urls[200:]) + "\n")
    assert second.returncode == 0, second.stderr
    assert redis_client.hget(keys.dictionaries, "current") == current  # the crawl's own
    payloads = [payload for _, payload in backqueues.pending(redis_client, keys)]
    assert len(payloads) == 300
    assert all(dictionary_id(payload) == int(current) for payload in payloads)

    crawler = get_crawler(PushedSpider, {**FAST_RETRIES, "REDIS_URL": redis_url})
    await crawler.crawl_async()
    assert sorted(url for _, url, _ in crawler.spider.seen) == sorted(urls)


def test_a_push_of_large_requests_trains_no_empty_dictionary(redis_url, redis_client):
    """A QA run: 200 pushed POST requests of 600 bytes each (larger than the training takes,
    ``SAMPLE_MAX_BYTES``) published an empty dictionary as the crawl's, kept for its life:
    a worker's request of 112 bytes then took 109, where a trained dictionary makes it 17.
    Such lines are stored plain and train nothing; the small lines of a later push do."""
    keys = Keys("ha", "pushed")
    url = "http://a.example/api"
    large = [
        json.dumps({"url": f"{url}/{i}", "method": "POST", "body": "q" * 600}) for i in range(200)
    ]
    first = push(redis_url, "-", stdin="\n".join(large) + "\n")
    assert first.returncode == 0, first.stderr
    assert redis_client.hgetall(keys.dictionaries) == {}  # no empty one: a worker will train
    assert all(dictionary_id(p) is None for _, p in backqueues.pending(redis_client, keys))
    small = push(redis_url, "-", stdin="\n".join(f"{url}/item/{i}" for i in range(200)) + "\n")
    assert small.returncode == 0, small.stderr
    current = redis_client.hget(keys.dictionaries, "current")
    assert current is not None
    assert len(redis_client.hget(keys.dictionaries, current)) > 1000
