"""``HA_PROXY_URL`` (or any proxy setting) without ``HA_PROXY_MODE`` is named at start: the
proxy is used only in a mode. A QA run: ``-s HA_PROXY_URL=...`` alone, the setting a user
reaches for first, did nothing, silently, and every request went direct."""

from __future__ import annotations

import logging

from scrapy import Spider
from scrapy.utils.test import get_crawler

from scrapy_ha.scheduler.shell import Scheduler


def start_warnings(caplog, settings):
    """The WARNINGs a scheduler built with *settings* logs at start (what it names)."""
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        Scheduler.from_crawler(get_crawler(Spider, settings))
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_proxy_settings_without_a_mode_are_named_at_start(caplog, monkeypatch):
    monkeypatch.delenv("HA_PROXY_MODE", raising=False)
    given = {"HA_PROXY_URL": "http://u:hunter2@proxy.test:8000", "HA_PROXY_COOLDOWN": 60}
    (warned,) = start_warnings(caplog, given)
    assert warned == (
        "HA_PROXY_URL, HA_PROXY_COOLDOWN do nothing while HA_PROXY_MODE is not set: requests "
        "go direct (HA_PROXY_MODE = 'tunnel' for one proxy URL, 'pool' for a proxy list API)"
    )
    assert "hunter2" not in warned
    assert start_warnings(caplog, {**given, "HA_PROXY_MODE": "tunnel"}) == []
    monkeypatch.setenv("HA_PROXY_MODE", "tunnel")  # the mode may come from the environment
    assert start_warnings(caplog, given) == []


def test_proxy_settings_the_environment_cannot_give_are_named_at_start(caplog, monkeypatch):
    """Only the mode, the proxy's address and its credentials are read from the environment:
    ``HA_PROXY_COOLDOWN=30`` exported beside ``HA_PROXY_MODE`` kept every banned proxy out
    for the default 300 s, silently."""
    monkeypatch.setenv("HA_PROXY_MODE", "pool")
    monkeypatch.setenv("HA_PROXY_POOL_URL", "http://u:hunter2@api.test/list")
    monkeypatch.setenv("HA_PROXY_COOLDOWN", "30")
    monkeypatch.setenv("HA_PROXY_ALLOW_DIRECT", "True")
    (warned,) = start_warnings(caplog, {})
    assert warned == (
        "HA_PROXY_COOLDOWN, HA_PROXY_ALLOW_DIRECT in the environment do nothing: give them in "
        "settings (or -s); of the proxy's settings only HA_PROXY_MODE, HA_PROXY_URL, "
        "HA_PROXY_HOST, HA_PROXY_PORT, HA_PROXY_USER, HA_PROXY_PASSWORD, HA_PROXY_POOL_URL "
        "are read from the environment"
    )
    assert "hunter2" not in warned
    # given in settings too, the setting is read: nothing to say
    assert start_warnings(caplog, {"HA_PROXY_COOLDOWN": 30, "HA_PROXY_ALLOW_DIRECT": True}) == []


def test_proxy_settings_in_the_environment_without_a_mode_are_not_named(caplog, monkeypatch):
    """A crawl that uses no proxy (no HA_PROXY_MODE in settings or the environment) is
    not told about the proxy settings a shell exported: they would do nothing anyway
    (before, ``HA_PROXY_COOLDOWN=30`` in the environment of a crawl without proxies was
    named in a WARNING at every start)."""
    monkeypatch.delenv("HA_PROXY_MODE", raising=False)
    monkeypatch.setenv("HA_PROXY_COOLDOWN", "30")
    monkeypatch.setenv("HA_PROXY_MAX_FAILURES", "3")
    assert start_warnings(caplog, {}) == []
    (warned,) = start_warnings(caplog, {"HA_PROXY_MODE": "pool"})  # in a mode: named
    assert warned.startswith("HA_PROXY_COOLDOWN, HA_PROXY_MAX_FAILURES in the environment do ")
