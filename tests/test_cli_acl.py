"""A ``scrapy-ha`` command run as an ACL user that Redis refuses a command or a key says so
and exits with 2. A QA run: ``scrapy-ha pause`` as a user without ``TIME`` ended in a
traceback of redis-py's ``NoPermissionError``."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.cli_seed import scrapy_ha

USER = "qa-no-time"


@pytest.fixture
def limited_url(redis_url, redis_client):
    redis_client.execute_command(
        "ACL", "SETUSER", USER, "on", f">{USER}", "~*", "&*", "+@all", "-time"
    )
    parts = urlsplit(redis_url)
    try:
        yield urlunsplit(parts._replace(netloc=f"{USER}:{USER}@{parts.netloc}"))
    finally:
        redis_client.execute_command("ACL", "DELUSER", USER)


def test_a_command_redis_refuses_the_user_is_named_not_a_traceback(redis_url, limited_url):
    pushed = scrapy_ha("push", "books", "http://a.test/1", "--create", "--redis-url", redis_url)
    assert pushed.returncode == 0, pushed.stderr
    done = scrapy_ha("pause", "books", "--redis-url", limited_url)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"Redis at redis://{USER}:***@" in done.stderr
    assert "refused this user a command or a key" in done.stderr
    assert "no permissions to run the 'time' command" in done.stderr
    assert USER + ":" + USER not in done.stderr + done.stdout  # the password stays masked


def test_status_as_a_user_refused_a_command_names_the_redis_not_the_crawl(redis_url, redis_client):
    """A QA run: ``status`` as a user without ``EVAL`` said ``cannot read the crawl books:
    Command # 1 (EVAL ...) of pipeline caused error``, as if a key of the crawl were bad."""
    user = "qa-no-eval"
    acl = ("on", f">{user}", "~*", "&*", "+@all", "-eval")
    redis_client.execute_command("ACL", "SETUSER", user, *acl)
    parts = urlsplit(redis_url)
    limited = urlunsplit(parts._replace(netloc=f"{user}:{user}@{parts.netloc}"))
    try:
        pushed = scrapy_ha("push", "books", "http://a.test/1", "--create", "--redis-url", redis_url)
        assert pushed.returncode == 0, pushed.stderr
        done = scrapy_ha("status", "books", "--redis-url", limited)
    finally:
        redis_client.execute_command("ACL", "DELUSER", user)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "cannot read the crawl" not in done.stderr, done.stderr
    assert f"Redis at redis://{user}:***@" in done.stderr
    assert "refused this user a command or a key" in done.stderr
    assert "no permissions to run the 'eval' command" in done.stderr
