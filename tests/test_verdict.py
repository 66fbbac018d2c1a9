"""The verdict on a failed attempt: typed, frozen, and stored under the same names as ever."""

from __future__ import annotations

import dataclasses
import json

import pytest
from scrapy import Request
from scrapy.settings import Settings

from scrapy_ha import metakeys
from scrapy_ha.config.retry import RetryConfig
from scrapy_ha.middlewares.policy import Failure, decide
from scrapy_ha.verdict import RETRY_CLASSES, FailureClass, Verdict

#: The class names stored in Redis, stats and logs before the enum existed.
STORED_NAMES = {
    "network",
    "server",
    "rate_limited",
    "banned",
    "parse",
    "pipeline",
    "gone",
    "client",
    "permanent",
    "no_proxy",
    "proxy_error",
    "proxy_auth",
    "gate",
    "unstorable",
}


def test_failure_classes_keep_their_stored_names():
    assert {c.value for c in FailureClass} == STORED_NAMES
    assert f"ha/retry/{FailureClass.RATE_LIMITED}" == "ha/retry/rate_limited"
    assert json.dumps({"class": FailureClass.BANNED}) == '{"class": "banned"}'
    assert {c.value for c in RETRY_CLASSES} == STORED_NAMES - {
        "no_proxy",
        "proxy_error",
        "proxy_auth",
        "gate",
        "unstorable",
    }


@pytest.mark.parametrize(
    ("verdict", "stored"),
    [
        (
            Verdict.retry(FailureClass.SERVER, "HTTP 500", 3.5, status=500),
            {"op": "retry", "class": "server", "reason": "HTTP 500", "delay": 3.5, "status": 500},
        ),
        (
            Verdict.retry(FailureClass.NO_PROXY, "no usable proxy", 30.0),
            {"op": "retry", "class": "no_proxy", "reason": "no usable proxy", "delay": 30.0},
        ),
        (
            Verdict.dead(FailureClass.GONE, "HTTP 404", status=404, attempts=1),
            {"op": "dead", "class": "gone", "reason": "HTTP 404", "status": 404, "attempts": 1},
        ),
        (
            Verdict.dead(FailureClass.PARSE, "KeyError: 'x'", attempts=3).handled_by_errback(),
            {
                "op": "dead",
                "class": "parse",
                "reason": "KeyError: 'x'",
                "attempts": 3,
                "errback": True,
            },
        ),
    ],
)
def test_a_verdict_reads_as_the_mapping_the_dead_letter_queue_stores(verdict, stored):
    assert verdict.as_dict() == stored
    assert dict(verdict) == stored  # what the scheduler's {**outcome} gives
    assert verdict["op"] == stored["op"]
    assert verdict.get("delay") == stored.get("delay")
    assert Verdict.from_meta({metakeys.OUTCOME: stored}) == verdict
    assert Verdict.from_meta({metakeys.OUTCOME: verdict}) is verdict


def test_a_verdict_is_frozen_and_none_is_none():
    verdict = Verdict.retry(FailureClass.SERVER, "HTTP 503", 1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        verdict.delay = 2.0  # type: ignore[misc]
    assert Verdict.from_meta({}) is None
    assert Verdict.from_meta({metakeys.OUTCOME: None}) is None


@pytest.mark.parametrize(
    ("stored", "op", "fclass", "delay"),
    [
        ({"op": "dead", "class": "captcha"}, "dead", "captcha", None),  # a class of the user's
        ({"op": "retry", "delay": 5}, "retry", "unknown", 5.0),  # no class
        ({"class": "banned"}, None, None, None),  # no op: no verdict, the request is acked
        ({"op": "ack", "class": "banned"}, None, None, None),
        ("dead", None, None, None),
    ],
)
def test_a_verdict_mapping_is_read_as_leniently_as_the_scheduler_always_did(
    stored, op, fclass, delay
):
    verdict = Verdict.from_meta({metakeys.OUTCOME: stored})
    if op is None:
        assert verdict is None
        return
    assert verdict is not None
    assert (verdict.op, str(verdict.failure_class), verdict.delay) == (op, fclass, delay)
    assert verdict.as_dict()["class"] == fclass


def test_decide_puts_its_verdict_in_meta():
    settings = Settings()
    settings.setmodule("scrapy.settings.default_settings")
    config = RetryConfig.from_settings(settings)
    request = Request("https://example.com/x")
    failure = Failure("server", "HTTP 500", 500)  # a class by its stored name is the same class
    verdict = decide(request, failure, config, worker="w", now_ms=0, rand=lambda: 0.0)
    assert request.meta[metakeys.OUTCOME] is verdict
    assert (verdict.op, verdict.failure_class, verdict.delay) == ("retry", FailureClass.SERVER, 3.0)
    assert request.meta[metakeys.RETRIES] == {"server": 1}
    assert request.meta[metakeys.HISTORY][-1]["class"] == "server"
