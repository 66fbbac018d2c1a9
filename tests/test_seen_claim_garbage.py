"""A crawl's claim (``ha:{S}:filter``) that no worker wrote (bytes that are not UTF-8, a
TTL that is no number, infinite or out of range, a key of another type): ``seen check``
and ``push`` name the key and what is wrong, exit code 2, no traceback. Real
redis-server, the console script as a user runs it."""

from __future__ import annotations

import pytest

from scrapy_ha.keys import Keys
from tests.cli_seed import scrapy_ha

KEYS = Keys("ha", "catalogue")
KEY = KEYS.filter_kind
UNREADABLE = f"error: the crawl's claim {KEY} is unreadable: "


@pytest.fixture(autouse=True)
def crawl(redis_client) -> None:
    """A crawl in Redis (one of its keys), for commands that refuse to act on none."""
    redis_client.hset(KEYS.stats, "ha/dead/gone", 1)


@pytest.mark.parametrize(
    ("claim", "why"),
    [
        (b"\xff\xfe", "'\ufffd\ufffd' is no dupefilter kind (set or bloom"),
        (b"set sliced \xff", "its TTL '\ufffd' is no number"),
        (b"set sliced nan", "its TTL 'nan' is not 0 nor 1 to 1e+10 s"),
        (b"set sliced inf", "its TTL 'inf' is not 0"),
        (b"bloom sliced 1e400", "its TTL '1e400' is not 0"),
        (b"set sliced 1e300", "its TTL '1e300' is not 0"),
        (b"set sliced 0.5", "its TTL '0.5' is not 0"),
        (b"set kept", "'set kept' is no dupefilter kind"),
    ],
)
def test_seen_check_and_push_name_an_unreadable_claim(redis_url, redis_client, claim, why):
    redis_client.set(KEY, claim)
    for command in (
        ["seen", "check", "catalogue", "http://example.com/a"],
        ["push", "catalogue", "http://example.com/a", "--create"],
    ):
        done = scrapy_ha(*command, "--redis-url", redis_url)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert done.stderr.startswith(UNREADABLE + why), (command, done.stderr)
        assert "Traceback" not in done.stderr


def test_a_claim_of_another_type_is_named(redis_url, redis_client):
    redis_client.hset(KEY, "kind", "set")
    for command in (
        ["seen", "check", "catalogue", "http://example.com/a"],
        ["push", "catalogue", "http://example.com/a", "--create"],
    ):
        done = scrapy_ha(*command, "--redis-url", redis_url)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert done.stderr.startswith(UNREADABLE + "it holds a hash, not a string"), done.stderr


def test_a_readable_claim_still_reads(redis_url, redis_client):
    """An earlier version's claim (time slices, no TTL) and one of today's: no error."""
    for claim in (b"set sliced", b"set sliced 3600", b"set"):
        redis_client.set(KEY, claim)
        done = scrapy_ha(
            "seen", "check", "catalogue", "http://example.com/a", "--redis-url", redis_url
        )
        assert done.returncode == 1 and "not seen" in done.stdout, (claim, done.stderr)
