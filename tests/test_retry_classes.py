"""Failure classes, backoff, Retry-After and the retry budget (no Redis needed)."""

from __future__ import annotations

import time

import pytest
from scrapy import Request
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from scrapy.settings import Settings
from twisted.internet.error import DNSLookupError, TimeoutError

from scrapy_ha.config.retry import Policy, RetryConfig
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.middlewares.policy import Failure, decide, retry_after_seconds
from scrapy_ha.scheduler.domains import ClosedDomains
from scrapy_ha.verdict import PermanentError

DEFAULTS = Settings()
DEFAULTS.setmodule("scrapy.settings.default_settings")


def config(**settings) -> RetryConfig:
    s = DEFAULTS.copy()
    s.update(settings)
    return RetryConfig.from_settings(s)


def response(status: int, headers: dict | None = None) -> Response:
    return Response("https://example.com/x", status=status, headers=headers or {})


@pytest.mark.parametrize(
    ("status", "headers", "cls"),
    [
        (200, {}, None),
        (301, {}, None),
        (500, {}, "server"),
        (502, {}, "server"),
        (503, {}, "server"),
        (503, {"Retry-After": "5"}, "rate_limited"),
        (522, {}, "server"),
        (524, {}, "server"),
        (408, {}, "server"),
        (429, {}, "rate_limited"),
        (403, {}, "banned"),
        (404, {}, "gone"),
        (410, {}, "gone"),
        (400, {}, "client"),
        (451, {}, "client"),
    ],
)
def test_status_classes(status, headers, cls):
    assert config().classify_response(response(status, headers)) == cls


def test_status_classes_and_ban_checks_are_configurable():
    c = config(
        HA_RETRY_STATUS_CLASSES={404: "server", 418: "banned", 500: None},
        HA_BAN_CHECK="tests.test_retry_classes.captcha",
    )
    assert c.classify_response(response(404)) == "server"
    assert c.classify_response(response(418)) == "banned"
    assert c.classify_response(response(500)) is None
    banned = Response("https://example.com", status=200, body=b"<p>captcha</p>")
    assert c.classify_response(banned) == "banned"


def captcha(response: Response) -> bool:
    return b"captcha" in response.body


@pytest.mark.parametrize(
    ("exception", "cls"),
    [
        (TimeoutError(), "network"),
        (DNSLookupError(), "network"),
        (ConnectionRefusedError(), "network"),
        (PermanentError(), "permanent"),
        (ValueError(), None),
    ],
)
def test_exception_classes(exception, cls):
    assert config().classify_exception(exception) == cls


def test_user_listed_permanent_exceptions():
    c = config(HA_RETRY_PERMANENT_EXCEPTIONS=["builtins.LookupError"])
    assert c.classify_exception(KeyError()) == "permanent"


def test_backoff_is_exponential_capped_and_jittered():
    p = Policy(times=5, base=3, multiplier=2, max=120)
    assert [p.backoff(n, 0, lambda: 0.5) for n in range(7)] == [3, 6, 12, 24, 48, 96, 120]
    assert p.backoff(2, 1.0, lambda: 0.25) == 9  # full jitter: anywhere in (0, 12]
    assert p.backoff(2, 0.5, lambda: 1.0) == 6  # half jitter: in [6, 12]


def test_retry_after_seconds_and_http_date():
    assert retry_after_seconds(response(429, {"Retry-After": "7"})) == 7
    dated = response(
        503,
        {"Retry-After": "Wed, 21 Oct 2026 07:28:30 GMT", "Date": "Wed, 21 Oct 2026 07:28:00 GMT"},
    )
    assert retry_after_seconds(dated) == 30
    assert retry_after_seconds(response(429, {"Retry-After": "soon"})) is None
    assert retry_after_seconds(response(429)) is None


def test_decide_spends_the_budget_of_each_class_then_gives_up():
    c = config(HA_RETRY_JITTER=0, HA_RETRY_TIMES=2)
    request = Request("https://example.com", meta={"proxy": "http://u:secret@proxy:1"})
    verdicts = [
        decide(request, Failure("server", "HTTP 500", 500), c, worker="w", now_ms=i)
        for i in range(3)
    ]
    assert [v["op"] for v in verdicts] == ["retry", "retry", "dead"]
    assert [v.get("delay") for v in verdicts[:2]] == [3, 6]
    assert verdicts[2]["attempts"] == 3
    # another class has its own budget
    assert (
        decide(request, Failure("banned", "HTTP 403", 403), c, worker="w", now_ms=9)["op"]
        == "retry"
    )
    history = request.meta["ha_history"]
    assert [h["outcome"] for h in history] == ["HTTP 500"] * 3 + ["HTTP 403"]
    assert history[0]["proxy"] == "http://proxy:1"  # never the password


def test_retry_after_is_honoured_and_capped():
    c = config(HA_RETRY_JITTER=0, HA_RETRY_AFTER_MAX=60)
    request = Request("https://example.com")
    assert (
        decide(
            request,
            Failure("rate_limited", "HTTP 429", 429, retry_after=30),
            c,
            worker="w",
            now_ms=0,
        )["delay"]
        == 30
    )
    assert (
        decide(
            request,
            Failure("rate_limited", "HTTP 429", 429, retry_after=3600),
            c,
            worker="w",
            now_ms=0,
        )["delay"]
        == 60
    )


def test_a_retry_after_with_jitter_is_never_earlier_than_the_site_asked():
    """The spread that keeps workers apart is added: coming back before the site's time
    asks for another 429 (with the default jitter; the test above sets none)."""
    c = config(HA_RETRY_JITTER=1.0, HA_RETRY_AFTER_MAX=600)
    failure = Failure("rate_limited", "HTTP 429", 429, retry_after=100)
    delays = [
        decide(Request("https://e.com"), failure, c, worker="w", now_ms=0, rand=lambda r=r: r)[
            "delay"
        ]
        for r in (0.0, 0.5, 0.999)
    ]
    assert delays == [100, 105, pytest.approx(109.99)], delays


def test_permanent_classes_and_per_request_budget():
    c = config()
    assert (
        decide(Request("https://e.com"), Failure("gone", "HTTP 404", 404), c, worker="w", now_ms=0)[
            "op"
        ]
        == "dead"
    )
    request = Request("https://e.com", meta={"ha_retry_times": 0})
    assert (
        decide(request, Failure("server", "HTTP 500", 500), c, worker="w", now_ms=0)["op"] == "dead"
    )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"HA_RETRY_TIMES": -1}, "HA_RETRY_TIMES=-1"),
        ({"HA_RETRY_BACKOFF_BASE": "x"}, "HA_RETRY_BACKOFF_BASE='x' is not a number"),
        ({"HA_RETRY_JITTER": 2}, "HA_RETRY_JITTER=2.0 must be between 0 and 1"),
        ({"HA_RETRY_POLICIES": {"serverr": {"times": 1}}}, "HA_RETRY_POLICIES['serverr']"),
        ({"HA_RETRY_POLICIES": {"server": {"tries": 1}}}, "HA_RETRY_POLICIES['server']"),
        ({"HA_RETRY_STATUS_CLASSES": {404: "lost"}}, "HA_RETRY_STATUS_CLASSES[404]='lost'"),
        ({"HA_RETRY_PERMANENT_EXCEPTIONS": ["no.such.Error"]}, "'no.such.Error'"),
        # a QA run: taken, then every failure judged raised a TypeError (dead-lettered)
        ({"HA_RETRY_PERMANENT_EXCEPTIONS": ["math.pi"]}, "'math.pi', which is not an exce"),
        ({"RETRY_EXCEPTIONS": ["os.path"]}, "RETRY_EXCEPTIONS names 'os.path', which is not"),
        ({"HA_BAN_CHECK": "no.such.check"}, "HA_BAN_CHECK='no.such.check'"),
        # before, each of these passed, and failed (or misbehaved) at the first retry
        ({"HA_RETRY_POLICIES": {"server": {"times": 2.5}}}, "['server']['times']=2.5 must be"),
        ({"HA_RETRY_POLICIES": {"server": {"times": -1}}}, "['server']['times']=-1 must be"),
        ({"HA_RETRY_POLICIES": {"server": {"base": "x"}}}, "['server']['base']='x' is not a"),
        ({"HA_RETRY_POLICIES": {"server": {"max": -10}}}, "['server']['max']=-10 must be 0"),
        (
            {"HA_RETRY_POLICIES": {"parse": {"base": float("nan")}}},
            "['parse']['base']=nan is not a",
        ),
        ({"HA_RETRY_POLICIES": {"gone": {"multiplier": "inf"}}}, "['multiplier']='inf' must be"),
        ({"HA_RETRY_BACKOFF_BASE": "inf"}, "HA_RETRY_BACKOFF_BASE='inf' must be a finite"),
        ({"HA_RETRY_BACKOFF_MULTIPLIER": "nan"}, "HA_RETRY_BACKOFF_MULTIPLIER='nan' is not"),
        ({"HA_RETRY_BACKOFF_MAX": float("inf")}, "HA_RETRY_BACKOFF_MAX=inf must be a finite"),
        ({"HA_RETRY_AFTER_MAX": "nan"}, "HA_RETRY_AFTER_MAX='nan' is not a number"),
        ({"RETRY_PRIORITY_ADJUST": "x"}, "RETRY_PRIORITY_ADJUST='x' must be a whole number"),
        # int() takes these, and made 2 and -1 of them, silently
        ({"RETRY_PRIORITY_ADJUST": 2.5}, "RETRY_PRIORITY_ADJUST=2.5 must be a whole number"),
        ({"RETRY_PRIORITY_ADJUST": "-1.0"}, "RETRY_PRIORITY_ADJUST='-1.0' must be a whole"),
        # a status no answer has was taken without a word (QA)
        ({"HA_RETRY_STATUS_CLASSES": {"99999": "server"}}, "['99999']: not an HTTP status"),
        ({"HA_RETRY_STATUS_CLASSES": {42: "server"}}, "[42]: not an HTTP status code"),
        ({"HA_RETRY_STATUS_CLASSES": {"x": "server"}}, "['x']: not an HTTP status code"),
    ],
)
def test_bad_retry_settings_name_themselves(settings, message):
    with pytest.raises(ConfigError, match=None) as info:
        config(**settings)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("settings", "priorities"),
    [
        ({}, [9, 8, 7]),  # Scrapy's default RETRY_PRIORITY_ADJUST is -1
        ({"RETRY_PRIORITY_ADJUST": 0}, [10, 10, 10]),
        ({"RETRY_PRIORITY_ADJUST": -5}, [5, 0, -5]),
    ],
)
def test_each_retry_adjusts_the_priority_as_scrapy_does(settings, priorities):
    cfg = config(HA_RETRY_TIMES=3, **settings)
    request = Request("https://example.com/x", priority=10)
    seen = []
    for _ in range(3):
        assert (
            decide(request, Failure("server", "HTTP 500"), cfg, worker="w", now_ms=0)["op"]
            == "retry"
        )
        seen.append(request.priority)
    assert seen == priorities
    decide(request, Failure("server", "HTTP 500"), cfg, worker="w", now_ms=0)  # dead: unchanged
    assert request.priority == priorities[-1]


@pytest.mark.parametrize("value", [b"\xb9", b"\xb2", b"\xb3", b"Fri, 31 Dec 99999 23:59:59 GMT"])
def test_an_unreadable_retry_after_is_none(value):
    """Before: latin-1 '¹' '²' '³' passed str.isdigit() and float() raised ValueError."""
    assert retry_after_seconds(response(429, {"Retry-After": value})) is None


@pytest.mark.parametrize("garbage", [7, "x", ["a"]])
def test_a_failure_the_policy_cannot_judge_is_dead_class_error_never_acked(garbage):
    """A bug or garbage in the policy's handling (here meta ha_retries that is not a
    mapping of counts). Before: the exception left the middleware, no verdict was set, and
    the scheduler acked the request: lost, without a dead letter."""
    from scrapy.utils.test import get_crawler  # noqa: PLC0415

    from scrapy_ha.middlewares.retry import RetryMiddleware  # noqa: PLC0415

    middleware = RetryMiddleware.from_crawler(get_crawler(settings_dict={}))
    request = Request("https://example.com/x", meta={"ha_retries": garbage})
    # the answer goes no further: its callback does not run on a page dead-lettered (a
    # review: it ran, then a requeue did the page twice)
    with pytest.raises(IgnoreRequest):
        middleware.process_response(request, response(500))
    verdict = request.meta["ha_outcome"]
    assert (verdict["op"], verdict["class"]) == ("dead", "error")
    assert verdict["reason"].startswith("could not judge the failure: ")
    request = Request("https://example.com/x", meta={"ha_retries": garbage})
    assert middleware.process_exception(request, TimeoutError()) is None
    assert request.meta["ha_outcome"]["class"] == "error"
    assert middleware.stats.get_value("ha/retry/gave_up/error") == 2


def test_policy_fields_are_read_as_their_settings_are():
    """{"times": "5"} is 5, as HA_RETRY_TIMES="5" is (before: a str, and every 500 raised
    TypeError in the middleware)."""
    c = config(HA_RETRY_POLICIES={"server": {"times": "5", "base": "2"}})
    assert c.policies["server"] == Policy(times=5, base=2.0, multiplier=2.0, max=120.0)
    assert c.policies["network"].base == 1.0  # the other classes keep their defaults


@pytest.mark.parametrize(("multiplier", "attempt"), [(2, 1100), (10, 400), (1e300, 2)])
def test_backoff_past_a_float_is_the_cap(multiplier, attempt):
    """Before: 2.0 ** 1100 raised OverflowError in decide(), after the attempt was counted."""
    c = config(HA_RETRY_TIMES=5000, HA_RETRY_JITTER=0, HA_RETRY_BACKOFF_MULTIPLIER=multiplier)
    request = Request("https://example.com/x", meta={"ha_retries": {"server": attempt}})
    verdict = decide(request, Failure("server", "HTTP 500"), c, worker="w", now_ms=0)
    assert (verdict["op"], verdict["delay"]) == ("retry", 120.0)
    assert Policy(base=0.0, multiplier=2).ceiling(1100) == 0.0


@pytest.mark.parametrize("garbage", ["3", 2.5, -1, True, [3]])
def test_a_bad_per_request_budget_warns_and_the_class_budget_applies(garbage, caplog):
    """Before: meta ha_retry_times "3" raised TypeError in decide() (no verdict: acked)."""
    c = config(HA_RETRY_TIMES=1)
    request = Request("https://example.com/x", meta={"ha_retry_times": garbage})
    ops = [
        decide(request, Failure("server", "HTTP 500"), c, worker="w", now_ms=0)["op"]
        for _ in range(2)
    ]
    assert ops == ["retry", "dead"]
    assert f"meta['ha_retry_times']={garbage!r} is not a whole number" in caplog.text


@pytest.mark.parametrize(
    ("failure", "ops"),
    [
        (Failure("gone", "HTTP 404", 404), ["dead"]),
        (Failure("client", "HTTP 400", 400), ["dead"]),
        (Failure("permanent", "PermanentError: never"), ["dead"]),
        (Failure("server", "HTTP 500", 500), ["retry", "retry", "dead"]),  # even at times 0
    ],
)
def test_a_per_request_budget_never_retries_a_permanent_failure(failure, ops):
    """DESIGN.md: 404, 410 gone, no retry; user-marked permanent errors: no retry.
    Before: meta ha_retry_times=2 retried a PermanentError and a 404 twice."""
    c = config(HA_RETRY_TIMES=0)
    request = Request("https://example.com/x", meta={"ha_retry_times": 2})
    got = [decide(request, failure, c, worker="w", now_ms=0)["op"] for _ in ops]
    assert got == ops


def test_a_per_request_budget_lowers_a_permanent_class_it_was_given():
    c = config(HA_RETRY_POLICIES={"client": {"times": 3}})
    request = Request("https://example.com/x", meta={"ha_retry_times": 1})
    failure = Failure("client", "HTTP 400", 400)
    ops = [decide(request, failure, c, worker="w", now_ms=0)["op"] for _ in range(2)]
    assert ops == ["retry", "dead"]


def test_an_alert_threshold_past_the_kept_entries_warns_at_start(caplog):
    """Before: HA_DLQ_ALERT_THRESHOLD 100 with HA_DLQ_MAX_ENTRIES 50 said nothing, and the
    alert could never fire."""
    from scrapy.settings import Settings  # noqa: PLC0415
    from scrapy.statscollectors import MemoryStatsCollector  # noqa: PLC0415
    from scrapy.utils.test import get_crawler  # noqa: PLC0415

    from scrapy_ha.config.scheduler import DeadLetterConfig  # noqa: PLC0415
    from scrapy_ha.scheduler.session.ends import Ends  # noqa: PLC0415

    stats = MemoryStatsCollector(get_crawler())
    # (each shard of a sharded crawl keeps HA_DLQ_MAX_ENTRIES: 2 x 50 can reach 100)
    for entries, shards, warned in ((50, 1, True), (100, 1, False), (50, 2, False)):
        caplog.clear()
        settings = Settings(
            {
                "HA_DLQ_ALERT_WEBHOOK": "http://127.0.0.1:9/hook",
                "HA_DLQ_MAX_ENTRIES": entries,
                "HA_SHARDS": shards,
            }
        )
        Ends(stats, DeadLetterConfig.from_settings(settings), settings)
        text = "HA_DLQ_ALERT_THRESHOLD=100 is more than HA_DLQ_MAX_ENTRIES=50"
        assert (text in caplog.text) is warned


def test_with_an_archive_the_threshold_warning_says_when_the_alert_can_be_sent(caplog, tmp_path):
    """A QA run: with an SQL archive, retention keeps the entries not archived yet, so the
    queue can pass HA_DLQ_MAX_ENTRIES: the alert said "can never be sent" was sent."""
    from scrapy.settings import Settings  # noqa: PLC0415
    from scrapy.statscollectors import MemoryStatsCollector  # noqa: PLC0415
    from scrapy.utils.test import get_crawler  # noqa: PLC0415

    from scrapy_ha.config.scheduler import DeadLetterConfig  # noqa: PLC0415
    from scrapy_ha.scheduler.session.ends import Ends  # noqa: PLC0415

    settings = Settings(
        {
            "HA_DLQ_ALERT_WEBHOOK": "http://127.0.0.1:9/hook",
            "HA_DLQ_ALERT_THRESHOLD": 2,
            "HA_DLQ_MAX_ENTRIES": 0,
            "HA_DLQ_ARCHIVE_URL": f"sqlite:///{tmp_path / 'failed.db'}",
        }
    )
    Ends(MemoryStatsCollector(get_crawler()), DeadLetterConfig.from_settings(settings), settings)
    assert "only while entries wait for the SQL archive" in caplog.text
    assert "can never be sent" not in caplog.text


def test_an_error_whose_text_raises_is_still_dead_lettered():
    """Review: an exception whose ``__str__`` raised made the safety net raise in its turn,
    and the request was acked and lost."""
    from scrapy_ha.middlewares.policy import error_verdict  # noqa: PLC0415

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    request = Request("https://example.com/x")
    verdict = error_verdict(request, Unprintable())
    assert (verdict.op, verdict.failure_class) == ("dead", "error")
    assert "Unprintable" in verdict.reason and request.meta["ha_outcome"]["class"] == "error"


def test_a_verdict_keeps_status_and_attempts_only_as_counts_cjson_reads_back():
    """Review: a status of 10**400 passed, Redis's cjson read it as infinity and could not
    write the record back, which then lost its history."""
    from scrapy_ha.verdict import Verdict  # noqa: PLC0415

    meta = {"ha_outcome": {"op": "dead", "class": "mine", "reason": "quota", "status": 10**400}}
    verdict = Verdict.from_meta(meta)
    assert verdict is not None and verdict.status is None


@pytest.mark.parametrize("status", [404, 410, 401, 451, 403, 408])
def test_a_missing_robots_txt_is_no_failure(status):
    """A site without robots.txt answers Scrapy's robots.txt fetch with a 4xx, which
    RFC 9309 reads as "no rules". It counted ``ha/retry/gave_up/gone`` in every crawl of
    ``ROBOTSTXT_OBEY`` (Scrapy's project template sets it) against such a site."""
    from scrapy.http.request import NO_CALLBACK  # noqa: PLC0415
    from scrapy.utils.test import get_crawler  # noqa: PLC0415

    from scrapy_ha.middlewares.retry import RetryMiddleware  # noqa: PLC0415

    middleware = RetryMiddleware.from_crawler(get_crawler(settings_dict={}))
    robots = Request(
        "https://example.com/robots.txt", meta={"dont_obey_robotstxt": True}, callback=NO_CALLBACK
    )
    answer = Response(robots.url, status=status)
    assert middleware.process_response(robots, answer) is answer
    assert "ha_outcome" not in robots.meta
    assert not {k for k in middleware.stats.get_stats() if k.startswith("ha/retry")}
    # a 5xx on robots.txt is still a failure to retry, and a page is judged as before
    assert isinstance(
        middleware.process_response(robots, Response(robots.url, status=503)), Request
    )
    page = Request("https://example.com/robots.txt")
    middleware.process_response(page, Response(page.url, status=status))
    assert page.meta["ha_outcome"]["op"] in ("dead", "retry")  # judged as any page


def test_robots_txt_is_retried_as_scrapy_retries_it_and_never_at_once_on_a_429():
    """Scrapy's robots.txt fetch is no request of the queue: a retry is downloaded again at
    once. It was retried up to the class's budget (5): a QA site answering 429 with
    ``Retry-After: 30`` got six fetches in 40 ms. A 429 is not retried at once (the site
    asked to wait; its domain's gate does), other failures as often as Scrapy's own
    ``RETRY_TIMES`` says (2)."""
    from scrapy.http.request import NO_CALLBACK  # noqa: PLC0415
    from scrapy.utils.test import get_crawler  # noqa: PLC0415

    from scrapy_ha.middlewares.retry import RetryMiddleware  # noqa: PLC0415

    middleware = RetryMiddleware.from_crawler(get_crawler(settings_dict={}))

    def robots() -> Request:
        meta = {"dont_obey_robotstxt": True}
        return Request("https://example.com/robots.txt", meta=meta, callback=NO_CALLBACK)

    limited, answer = robots(), Response("https://example.com/robots.txt", status=429)
    assert middleware.process_response(limited, answer) is answer
    tries, request = 1, robots()
    while isinstance(found := middleware.process_response(request, response(503)), Request):
        tries, request = tries + 1, found
    assert tries == 3  # (the first and Scrapy's 2 retries)
    page = Request("https://example.com/x")  # a page of the crawl keeps its budget
    assert isinstance(middleware.process_response(page, response(429)), Request)


def test_robots_txt_given_up_on_is_logged_as_scrapy_logs_it(caplog):
    """A robots.txt that answered 503 three times was given up on in silence (QA: a crawl
    of ``ROBOTSTXT_OBEY`` against a site whose robots.txt answered 503 went on without its
    rules, ``ha/retry/gave_up/server`` its only trace), where Scrapy's retry middleware
    logs "Gave up retrying" at ERROR. It is logged so."""
    from scrapy.http.request import NO_CALLBACK  # noqa: PLC0415
    from scrapy.utils.test import get_crawler  # noqa: PLC0415

    from scrapy_ha.middlewares.retry import RetryMiddleware  # noqa: PLC0415

    middleware = RetryMiddleware.from_crawler(get_crawler(settings_dict={}))
    request = Request(
        "https://example.com/robots.txt", meta={"dont_obey_robotstxt": True}, callback=NO_CALLBACK
    )
    with caplog.at_level("DEBUG", logger="scrapy_ha"):
        while isinstance(found := middleware.process_response(request, response(503)), Request):
            request = found
    given_up = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(given_up) == 1, caplog.text
    text = given_up[0].getMessage()
    assert "Gave up retrying <GET https://example.com/robots.txt> (failed 3 times)" in text
    assert "HTTP 503 (its body is read as the rules)" in text  # (Scrapy parses it)
    # a page of the crawl given up on is dead-lettered and logged there, not here
    page = Request("https://example.com/x")
    caplog.clear()
    middleware.process_response(page, response(404))
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


class _Gates:
    """A scheduler as the middlewares see it (``registry.CrawlScheduler``), closing gates
    into a list."""

    def __init__(self) -> None:
        self.gates: list[float] = []
        self.closed = ClosedDomains()

    def close_gate(self, request: Request, seconds: float) -> None:
        self.gates.append(seconds)

    def server_time_ms(self) -> int:
        return 0

    @property
    def config(self) -> object:
        return type("Config", (), {"worker_id": "w"})()


@pytest.mark.parametrize(
    ("headers", "gate"),
    [({}, 3.0), ({"Retry-After": "30"}, 30.0), ({"Retry-After": "9999"}, 600.0)],
)
def test_a_429_with_no_retry_left_closes_its_domain(headers, gate):
    """A 429 whose request has no retry left (robots.txt's, never retried at once; or a
    spent budget) closes its domain for its Retry-After, else the class's backoff ceiling
    (review: robots.txt's 429 without Retry-After closed none), at most HA_RETRY_AFTER_MAX."""
    from scrapy.http.request import NO_CALLBACK  # noqa: PLC0415
    from scrapy.utils.test import get_crawler  # noqa: PLC0415

    from scrapy_ha.middlewares.registry import register  # noqa: PLC0415
    from scrapy_ha.middlewares.retry import RetryMiddleware  # noqa: PLC0415

    crawler = get_crawler(settings_dict={"HA_RETRY_JITTER": 0})
    gates = _Gates()
    register(crawler, gates)  # type: ignore[arg-type]
    middleware = RetryMiddleware.from_crawler(crawler)
    meta = {"dont_obey_robotstxt": True}
    robots = Request("https://example.com/robots.txt", meta=meta, callback=NO_CALLBACK)
    answer = Response(robots.url, status=429, headers=headers)
    assert middleware.process_response(robots, answer) is answer
    assert gates.gates == [gate]


@pytest.mark.parametrize("value", ["x", "2.5", "-3"])
def test_a_retry_times_scrapy_cannot_read_is_named(value):
    """Scrapy's RETRY_TIMES, read for robots.txt's retries, was read with getint: "x" and
    "2.5" stopped the crawl with a bare ValueError, "-3" was 0 (review)."""
    with pytest.raises(ConfigError) as info:
        config(RETRY_TIMES=value)
    assert f"RETRY_TIMES={value!r} must be a whole number of 0 or more" in str(info.value)


@pytest.mark.parametrize(("value", "times"), [(3.0, 3), ("03", 3), (True, 1), (0, 0)])
def test_a_retry_times_scrapy_reads_is_read_as_scrapy_reads_it(value, times):
    """Review: the first check refused 3.0 and "03", which Scrapy's getint takes."""
    assert config(RETRY_TIMES=value).robots_retries == times


def test_a_429_whose_count_is_garbage_still_closes_its_domain():
    """Review: a count of ``inf`` in meta (garbage) made the gate's backoff fail, and the
    request was dead-lettered as ``error`` instead of ``rate_limited``."""
    from scrapy.utils.test import get_crawler  # noqa: PLC0415

    from scrapy_ha.middlewares.registry import register  # noqa: PLC0415
    from scrapy_ha.middlewares.retry import RetryMiddleware  # noqa: PLC0415

    crawler = get_crawler(settings_dict={"HA_RETRY_JITTER": 0})
    gates = _Gates()
    register(crawler, gates)  # type: ignore[arg-type]
    middleware = RetryMiddleware.from_crawler(crawler)
    request = Request("https://example.com/x", meta={"ha_retries": {"rate_limited": float("inf")}})
    middleware.process_response(request, response(429))
    assert request.meta["ha_outcome"]["class"] == "rate_limited" and gates.gates == [3.0]


class _SkewedGates(_Gates):
    """The scheduler of a worker whose clock is *skew_s* ahead of the Redis server's (the
    server's clock is what ``server_time_ms`` estimates from each sync's round trip)."""

    def __init__(self, skew_s: float) -> None:
        super().__init__()
        self.skew_s = skew_s

    def server_time_ms(self) -> int:
        return int((time.time() - self.skew_s) * 1000)


@pytest.mark.parametrize("skew_s", [-600.0, -30.0, 0.0, 30.0, 600.0])
def test_a_retry_after_date_without_date_is_read_by_the_crawls_clock(skew_s):
    """A 429 whose Retry-After is an HTTP date and which has no Date header is read against
    the crawl's clock (Redis's), not the worker's: a QA run with libfaketime, a site 40 s
    ahead, closed the domain for every worker for 612.9 s from a worker 10 minutes behind,
    and for none from one 10 minutes ahead."""
    from email.utils import formatdate  # noqa: PLC0415

    from scrapy.utils.test import get_crawler  # noqa: PLC0415

    from scrapy_ha.middlewares.registry import register  # noqa: PLC0415
    from scrapy_ha.middlewares.retry import RetryMiddleware  # noqa: PLC0415

    crawler = get_crawler(settings_dict={"HA_RETRY_JITTER": 0})
    gates = _SkewedGates(skew_s)
    register(crawler, gates)  # type: ignore[arg-type]
    middleware = RetryMiddleware.from_crawler(crawler)
    server_now = gates.server_time_ms() / 1000
    answer = response(429, {"Retry-After": formatdate(server_now + 40, usegmt=True)})
    assert isinstance(middleware.process_response(Request(answer.url), answer), Request)
    assert len(gates.gates) == 1 and 38.5 <= gates.gates[0] <= 40.0
    assert retry_after_seconds(answer, server_now) == pytest.approx(40.0, abs=1.5)


@pytest.mark.parametrize(
    ("settings", "meta", "handed"),
    [
        # a QA audit: HTTPERROR_ALLOW_ALL was not read, and a spider that handles every
        # status itself never saw its 404s (dead-lettered as gone)
        ({"HTTPERROR_ALLOW_ALL": True}, {}, True),
        ({"HTTPERROR_ALLOWED_CODES": [404]}, {}, True),
        ({}, {"handle_httpstatus_all": True}, True),
        # the request's own list goes first, as in Scrapy's HttpErrorMiddleware
        ({"HTTPERROR_ALLOW_ALL": True}, {"handle_httpstatus_list": [500]}, False),
        ({}, {}, False),
    ],
)
def test_a_status_the_spider_handles_itself_is_handed_to_it_unjudged(settings, meta, handed):
    from scrapy.utils.test import get_crawler  # noqa: PLC0415

    from scrapy_ha.middlewares.retry import RetryMiddleware  # noqa: PLC0415

    middleware = RetryMiddleware.from_crawler(get_crawler(settings_dict=settings))
    request, answer = Request("https://example.com/x", meta=meta), response(404)
    try:
        result = middleware.process_response(request, answer)
    except IgnoreRequest:
        result = None
    assert ("ha_outcome" not in request.meta) == handed  # no verdict: not retried, not dead
    assert result is answer or not handed
