"""HTTP Basic credentials printed without their header's name (``Basic dXNlcjpwdw==``, the
base64 of ``user:password``: the password as good as in clear) read ``***`` wherever a
worker's text goes, as a bearer token alone does: a callback that quotes the request's
``Authorization`` header in its error leaves the crawl's ``HTTPAUTH_PASS`` in no log line,
dead letter or tool."""

from __future__ import annotations

import base64
import logging
from typing import Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler
from w3lib.http import basic_auth_header

from scrapy_ha.codec.masking import mask_text
from scrapy_ha.keys import Keys
from tests.spiders import FaultSpider
from tests.test_cli import scrapy_ha

PASSWORD = "site-pw-4d1e9b"
CREDENTIALS = basic_auth_header("alice", PASSWORD).decode()  # "Basic YWxpY2U6..."
ENCODED = CREDENTIALS.split()[1]


def plain(text: str) -> str:
    """*text* and the Basic credentials in it decoded: a search finds the password."""
    shown = [text]
    for word in text.replace("'", " ").split():
        try:
            shown.append(base64.b64decode(word, validate=True).decode("latin-1"))
        except ValueError:
            continue
    return "\n".join(shown)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"login refused with b'{CREDENTIALS}'", "login refused with b'Basic ***'"),
        (f"[(b'Authorization', [b'{CREDENTIALS}'])]", "[(b'Authorization', '***')]"),
        (f"sent {CREDENTIALS}, got 401", "sent Basic ***, got 401"),
        (f"sent basic {ENCODED}", "sent basic ***"),
        # words that are no credentials stay: no "user:password" in them
        ("Basic authentication is required", "Basic authentication is required"),
        ('WWW-Authenticate: Basic realm="shop"', 'WWW-Authenticate: Basic realm="shop"'),
        ("Basic YWJjZA== decodes to no pair", "Basic YWJjZA== decodes to no pair"),
    ],
)
def test_basic_credentials_alone_are_masked(text, shown):
    assert mask_text(text) == shown


class QuotingSpider(FaultSpider):
    """Its callback's error quotes the Authorization header HttpAuthMiddleware added."""

    name = "quoting"

    def parse(self, response: Any) -> Any:
        raise ValueError(f"login refused with {response.request.headers.get('Authorization')}")


@deferred_f_from_coro_f
async def test_a_callback_quoting_its_basic_credentials_shows_them_nowhere(
    redis_url, redis_client, site, caplog
):
    settings = {
        "ADDONS": {"scrapy_ha.Addon": 0},
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.3,
        "HA_RETRY_POLICIES": {"parse": {"times": 0}},  # dead-lettered at once
        "HTTPAUTH_USER": "alice",
        "HTTPAUTH_PASS": PASSWORD,
        "HTTPAUTH_DOMAIN": site.url.split("://", 1)[1],  # compared with host:port
        "SCHEDULER_PERSIST": True,
        "LOG_LEVEL": "DEBUG",
    }
    crawler = get_crawler(QuotingSpider, settings)
    with caplog.at_level(logging.DEBUG):
        await crawler.crawl_async(base_url=site.url, paths=("/item/1",))
    keys = Keys("ha", "quoting")
    dead = [m.decode() for m in redis_client.zrange(keys.dead, 0, -1)]
    assert len(dead) == 1, caplog.text[-3000:]
    places = {
        "log": caplog.text,
        "dead letter": repr(redis_client.hgetall(keys.dead_info)),
        "dlq show": scrapy_ha("--redis-url", redis_url, "dlq", "show", "quoting", dead[0]).stdout,
        "dlq list": scrapy_ha("--redis-url", redis_url, "dlq", "list", "quoting").stdout,
    }
    assert "login refused with b'Basic ***'" in places["dlq show"], places["dlq show"]
    shown = [place for place, text in places.items() if PASSWORD in plain(text)]
    assert not shown, f"the site's password is shown in {shown}"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        # a spider logging list(request.headers.items()): (name, [values]) pairs
        ("[(b'X-Api-Key', [b'k-5f1e9a'])]", "[(b'X-Api-Key', '***')]"),
        (
            "[('Authorization', ['Token k-5f1e9a']), ('Accept', ['*/*'])]",
            "[('Authorization', '***'), ('Accept', ['*/*'])]",
        ),
        ("(('session_id', 'k-5f1e9a'),)", "(('session_id', '***'),)"),
        # a pair whose name is no secret, or no pair at all, stays
        ("[(b'Accept-Language', [b'en'])]", "[(b'Accept-Language', [b'en'])]"),
        ("f('token', x)", "f('token', x)"),
    ],
)
def test_a_header_given_as_a_name_and_value_pair_is_masked(text, shown):
    """``list(request.headers.items())`` in a log line showed an API key in clear, where the
    same headers printed as a mapping (``{b'X-Api-Key': [...]}``) read ``'***'``."""
    assert mask_text(text) == shown
