"""The one masking of everything that leaves a worker (``scrapy_ha.codec.masking``), form by
form: URLs of every kind, names in every spelling, headers, form and JSON bodies, free text,
stored requests and log records."""

from __future__ import annotations

import json
import logging

import pytest
import scrapy
from scrapy.http import JsonRequest, Request

from scrapy_ha import codec
from scrapy_ha.codec import encode_request
from scrapy_ha.codec.log_masking import install_log_masking
from scrapy_ha.codec.masking import (
    mask_body,
    mask_headers,
    mask_text,
    mask_url,
    secret_name,
)
from scrapy_ha.codec.summary import mask_payload

#: (what, given, shown): every form the masking meets. ``url`` through mask_url, ``text``
#: through mask_text, ``body`` through mask_body, ``header`` a header of that name.
FORMS = [
    # URLs: user info, of every scheme scrapy-ha meets
    ("url", "redis://:pw1@host:6379/0", "redis://:***@host:6379/0"),
    ("url", "redis://user:pw1@host/1", "redis://user:***@host/1"),
    (
        "url",
        "rediss://u:pw1@h:6380/0?ssl_cert_reqs=none",
        "rediss://u:***@h:6380/0?ssl_cert_reqs=none",
    ),
    (
        "url",
        "redis+sentinel://:pw1@s1:26379,s2:26379/mymaster/0",
        "redis+sentinel://:***@s1:26379,s2:26379/mymaster/0",
    ),
    ("url", "unix:///run/redis.sock?db=2&password=pw1", "unix:///run/redis.sock?db=2&password=***"),
    (
        "url",
        "http://bob-session-x:pw1@proxy.example:8000",
        "http://bob-session-x:***@proxy.example:8000",
    ),
    ("url", "https://u:p@ss@hooks.example/x", "https://u:***@hooks.example/x"),
    # a password holding '/', '?' or '#' unencoded (generated passwords often do)
    (  # of a URL naming several hosts (a QA run: shown whole)
        "url",
        "redis+cluster://:s3cret?x@h1:7000,h2:7001",
        "redis+cluster://:***@h1:7000,h2:7001",
    ),
    ("url", "redis+sentinel://:s3c#x@[::1]:1,s:2/m/0", "redis+sentinel://:***@[::1]:1,s:2/m/0"),
    # a review: an '@' then a '#' in the password; a '#' in a password of the query
    ("url", "redis://:p@ss#word@h:1/0", "redis://:***@h:1/0"),
    ("url", "redis://h:1/0?db=0&password=s3cr#et", "redis://h:1/0?db=0&password=***"),
    (
        "url",
        "http://crawler:Xk/9#s3cret@proxy.example:8000",
        "http://crawler:***@proxy.example:8000",
    ),
    (
        "url",
        "http://crawler:Ab?Cd#s3cret@proxy.example:8000",
        "http://crawler:***@proxy.example:8000",
    ),
    ("url", "http://crawler:pa#s3cret@10.0.0.1:8080/x", "http://crawler:***@10.0.0.1:8080/x"),
    # ...also one that starts with digits, so that it reads as a port (a spider's own
    # meta["proxy"]: the settings refuse such a URL, the log masks it)
    ("url", "http://user:123/abc@proxy:8080", "http://user:***@proxy:8080"),
    ("url", "http://user:12/ab#c@10.0.0.1:3128", "http://user:***@10.0.0.1:3128"),
    ("url", "http://u:9?x@[::1]:80", "http://u:***@[::1]:80"),
    (
        "text",
        "proxy http://user:123/abc@proxy:8080 failed",
        "proxy http://user:***@proxy:8080 failed",
    ),
    # ...but an '@' after a port, in a path or in a query is no password
    ("url", "http://shop.example:8080/u/@writer", "http://shop.example:8080/u/@writer"),
    (
        "url",
        "http://shop.example:8080/p?to=a@b.example",
        "http://shop.example:8080/p?to=a@b.example",
    ),
    (
        "url",
        "http://shop.example:8080/p?mail=a@b.example",
        "http://shop.example:8080/p?mail=a@b.example",
    ),
    ("url", "https://medium.example/@writer", "https://medium.example/@writer"),
    # archive URLs: libpq takes the password in the query string too
    (
        "url",
        "postgresql+psycopg://crawler@db/crawls?password=pw1",
        "postgresql+psycopg://crawler@db/crawls?password=***",
    ),
    (
        "url",
        "postgresql://crawler:pw1@db/crawls?sslmode=require&PASSWORD=pw2",
        "postgresql://crawler:***@db/crawls?sslmode=require&PASSWORD=***",
    ),
    ("url", "sqlite:///failed.db", "sqlite:///failed.db"),
    (
        "url",
        "mysql+pymysql://u:pw1@h/db?charset=utf8mb4",
        "mysql+pymysql://u:***@h/db?charset=utf8mb4",
    ),
    # request URLs: secret parameters in every spelling
    ("url", "https://a.example/?api_key=k&page=2", "https://a.example/?api_key=***&page=2"),
    ("url", "https://a.example/?apikey=k&APIKEY=k", "https://a.example/?apikey=***&APIKEY=***"),
    ("url", "https://a.example/?apiKey=k", "https://a.example/?apiKey=***"),
    (
        "url",
        "https://a.example/?accessToken=t&sort=asc",
        "https://a.example/?accessToken=***&sort=asc",
    ),
    ("url", "https://a.example/?apiToken=t", "https://a.example/?apiToken=***"),
    ("url", "https://a.example/?clientSecret=s", "https://a.example/?clientSecret=***"),
    ("url", "https://a.example/?secretKey=s", "https://a.example/?secretKey=***"),
    ("url", "https://a.example/?authToken=t", "https://a.example/?authToken=***"),
    ("url", "https://a.example/?privateKey=k", "https://a.example/?privateKey=***"),
    (
        "url",
        "https://a.example/?private-key=k&x-api-key=k",
        "https://a.example/?private-key=***&x-api-key=***",
    ),
    (
        "url",
        "https://a.example/?ACCESS_TOKEN=t&Access-Token=t",
        "https://a.example/?ACCESS_TOKEN=***&Access-Token=***",
    ),
    ("url", "https://a.example/?accesstoken=t", "https://a.example/?accesstoken=***"),
    (
        "url",
        "https://a.example/?user%5Bpassword%5D=p&user%5Bname%5D=n",
        "https://a.example/?user%5Bpassword%5D=***&user%5Bname%5D=n",
    ),
    (
        "url",
        "https://s3.example/o?X-Amz-Signature=abc&X-Amz-Expires=60",
        "https://s3.example/o?X-Amz-Signature=***&X-Amz-Expires=60",
    ),
    (
        "url",
        "https://a.example/cb#access_token=t&token_type=bearer",
        "https://a.example/cb#access_token=***&token_type=bearer",
    ),
    ("url", "https://a.example/x;jsessionid=abc?q=1", "https://a.example/x;jsessionid=***?q=1"),
    ("url", "https://a.example/?sid=s&sig=g&auth=a", "https://a.example/?sid=***&sig=***&auth=***"),
    (
        "url",
        "https://a.example/?monkey=banana&bypass=1&keyword=k&key_id=7",
        "https://a.example/?monkey=banana&bypass=1&keyword=k&key_id=7",
    ),
    (
        "url",
        "https://a.example/?password2=p&new_password=p",
        "https://a.example/?password2=***&new_password=***",
    ),
    ("url", "https://a.example/?token=", "https://a.example/?token="),
    # free text: log lines, reasons, settings as Scrapy logs them
    (
        "text",
        "Crawled (404) <GET http://h/x?apiToken=t&p=1> (referer: None)",
        "Crawled (404) <GET http://h/x?apiToken=***&p=1> (referer: None)",
    ),
    (
        "text",
        "{'HTTPAUTH_PASS': 'p', 'HTTPAUTH_USER': 'u'}",
        "{'HTTPAUTH_PASS': '***', 'HTTPAUTH_USER': 'u'}",
    ),
    (
        "text",
        "{'REDIS_URL': 'redis://:pw1@h:6379/0', 'LOG_LEVEL': 'INFO'}",
        "{'REDIS_URL': 'redis://:***@h:6379/0', 'LOG_LEVEL': 'INFO'}",
    ),
    (
        "text",
        "{'HA_DLQ_ALERT_WEBHOOK': 'https://hooks.example/T0/B0/tok'}",
        "{'HA_DLQ_ALERT_WEBHOOK': '***'}",
    ),
    (
        "text",
        "{'AWS_SECRET_ACCESS_KEY': 'x', 'AWS_ACCESS_KEY_ID': 'AKIA'}",
        "{'AWS_SECRET_ACCESS_KEY': '***', 'AWS_ACCESS_KEY_ID': 'AKIA'}",
    ),
    (
        "text",
        "{b'Authorization': [b'Bearer t'], b'Accept': [b'*/*']}",
        "{b'Authorization': '***', b'Accept': [b'*/*']}",
    ),
    ("text", "host=db port=5432 password=pw1 dbname=x", "host=db port=5432 password=*** dbname=x"),
    ("text", "Authorization: Basic dTpw\nAccept: */*", "Authorization: ***\nAccept: */*"),
    ("text", '{"password": "p", "n": 1}', '{"password": "***", "n": 1}'),
    ("text", "nothing secret here: 3 pages, 2 items", "nothing secret here: 3 pages, 2 items"),
    # a header inside a sentence (a dead letter's reason), and a bearer token alone: shown
    # as they were before
    (
        "text",
        "HTTP 401 (Authorization: Bearer SECRETRSN) password=pw",
        "HTTP 401 (Authorization: Bearer ***) password=***",
    ),
    ("text", "sent X-Api-Key: k3y, got 403", "sent X-Api-Key: ***, got 403"),
    ("text", "token Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig", "token Bearer ***"),
    ("text", "the bearer of news: 3 pages at 12:30", "the bearer of news: 3 pages at 12:30"),
    # review: a name that is no header swallowed the next one; schemes in any case
    ("text", "error: Authorization: Basic dXNlcjpwYXNz", "error: Authorization: Basic ***"),
    ("text", "refused: X-Api-Key: abc123secret", "refused: X-Api-Key: ***"),
    ("text", "(authorization: bearer eyJhbGciOiJIUzI1Ni)", "(authorization: bearer ***)"),
    ("text", "a 401: Authorization: Token 9944b09199c6", "a 401: Authorization: Token ***"),
    # ... and words that are no header's name stay
    ("text", "retry pass: 2 of 5; sort key: name", "retry pass: 2 of 5; sort key: name"),
    # a name ending in a secret's word, inside a line: Scrapy's "Telnet Password: <pw>" (a
    # Python console to whoever has it) was masked by the first version only (review)
    ("text", "Telnet Password: f371041502dbd735", "Telnet Password: ***"),
    (
        "text",
        "login ok with password: hunter2; token: abc",
        "login ok with password: ***; token: ***",
    ),
    ("text", "ok - X_API_KEY: hunter5, 3 tokens: 5", "ok - X_API_KEY: ***, 3 tokens: 5"),
    # a URL right after digits: its scheme begins at the first letter (reread: the first
    # linear pattern missed it)
    ("text", "at 1http://u:pw@h/x", "at 1http://u:***@h/x"),
    # an authority without its scheme, as an error quotes a URL's (a QA run: Twisted's
    # "invalid hostname" of a URL with credentials reached the dead-letter queue)
    (
        "text",
        "builtins.ValueError: invalid hostname: user8:SECRETURLPW8@127.0.0.2",
        "builtins.ValueError: invalid hostname: user8:***@127.0.0.2",
    ),
    ("text", "proxy u:p%40ss@[::1]:8080 refused", "proxy u:***@[::1]:8080 refused"),
    ("text", "at user:pa:ss@h.example", "at user:***@h.example"),  # a password holds ':'
    ("text", "at u!s=r:pw@h.example", "at u!s=r:***@h.example"),
    # ... and what is no user info stays: an address, a time, a URL's path
    ("text", "mail root@example.com at 12:30", "mail root@example.com at 12:30"),
    ("text", "see http://h/a:b@c for it", "see http://h/a:b@c for it"),
    # bodies: forms, JSON at any depth, multipart
    ("body", "user=u&password=p%40ss&remember=1", "user=u&password=***&remember=1"),
    (
        "body",
        "grant_type=client_credentials&client_secret=s&client_id=c",
        "grant_type=client_credentials&client_secret=***&client_id=c",
    ),
    ("body", '{"user": "u", "password": "p"}', '{"user": "u", "password": "***"}'),
    (
        "body",
        '{"auth": {"user": "u", "pass": "p"}, "items": [{"apiKey": "k", "n": 1}]}',
        '{"auth": "***", "items": [{"apiKey": "***", "n": 1}]}',
    ),
    ("body", '{"query": "books", "page": 2}', '{"query": "books", "page": 2}'),
    (
        "body",
        '--b\r\nContent-Disposition: form-data; name="password"\r\n\r\np\r\n--b\r\n'
        'Content-Disposition: form-data; name="user"\r\n\r\nu\r\n--b--\r\n',
        '--b\r\nContent-Disposition: form-data; name="password"\r\n\r\n***\r\n--b\r\n'
        'Content-Disposition: form-data; name="user"\r\n\r\nu\r\n--b--\r\n',
    ),
    # headers, by name in any spelling
    ("header", "Authorization", "***"),
    ("header", "Proxy-Authorization", "***"),
    ("header", "Cookie", "***"),
    ("header", "Set-Cookie", "***"),
    ("header", "X-Api-Key", "***"),
    ("header", "X-API-KEY", "***"),
    ("header", "x-auth-token", "***"),
    ("header", "X-Amz-Security-Token", "***"),
    ("header", "Ocp-Apim-Subscription-Key", "***"),
    ("header", "PRIVATE-TOKEN", "***"),
    ("header", "X-CSRFToken", "***"),
    ("header", "Accept", "v"),
    ("header", "Content-Type", "v"),
    ("header", "Referer", "v"),
]


@pytest.mark.parametrize(("what", "given", "shown"), FORMS)
def test_every_form_is_masked(what, given, shown):
    if what == "url":
        assert mask_url(given) == shown
        assert mask_text(f"at <GET {given}>") == f"at <GET {shown}>"  # in a sentence too
    elif what == "text":
        assert mask_text(given) == shown
    elif what == "body":
        assert mask_body(given.encode()) == shown.encode()
    else:
        assert mask_headers({given: ["v"]}) == {given: shown if shown == "***" else ["v"]}
        assert mask_headers({given.encode(): [b"v"]}) == {given: shown if shown == "***" else ["v"]}
    assert mask_text(shown) == shown  # masking twice changes nothing


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ("redis//:pw@h:6379/0", "redis//:***@h:6379/0"),
        ("redis:/:p:w@h", "redis:/:***@h"),
        ("u:p/w@h", "u:***@h"),
        (":pw@h:6379", ":***@h:6379"),
        ("redis//u@h:6379", "redis//u@h:6379"),
        ("h:6379", "h:6379"),
    ],
)
def test_a_url_whose_scheme_a_typo_lost_has_its_password_masked(given, shown):
    # a QA run: REDIS_URL = "redis//:pw@host" was refused with its password in the error
    assert mask_url(given) == shown
    assert mask_url(shown) == shown


def test_the_table_holds_forty_forms_or_more():
    assert len(FORMS) >= 40


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        *[(n, True) for n in ("accessToken", "access_token", "access-token", "ACCESS_TOKEN")],
        *[(n, True) for n in ("apiToken", "clientSecret", "secretKey", "authToken", "privateKey")],
        *[(n, True) for n in ("http_pass", "HTTPAUTH_PASS", "JSESSIONID", "ASP.NET_SessionId")],
        *[(n, False) for n in ("http_user", "http_auth_domain", "HTTPAUTH_USER", "token_type")],
        *[(n, False) for n in ("page", "monkey", "bypass", "REDIS_URL", "HA_SHARED_COOKIES")],
    ],
)
def test_names_are_read_by_their_words_whatever_the_spelling(name, secret):
    assert secret_name(name) is secret
    assert secret_name(name.encode()) is secret


def test_codec_keeps_its_documented_names():
    assert codec.mask_url is mask_url and codec.mask_payload is mask_payload


def test_a_stored_request_is_masked_whole_nested_requests_included():
    nested = scrapy.Request("http://h/next?authToken=t2", headers={"X-Api-Key": "k2"})
    request = JsonRequest(
        "http://h/x?accessToken=t1",
        data={"user": "u", "password": "p1"},
        headers={"Authorization": "Bearer b1", "Accept": "text/html"},
        cookies={"sid": "c1"},
        meta={"http_user": "alice", "http_pass": "p2", "next": nested, "apiKey": "k3"},
        cb_kwargs={"clientSecret": "s1", "page": 2},
    )
    stored = json.loads(encode_request(request, None))
    shown = json.dumps(mask_payload(stored))
    for secret in ("t1", "t2", "p1", "p2", "b1", "c1", "k2", "k3", "s1"):
        assert f'"{secret}"' not in shown and f"={secret}" not in shown, secret
    shown_doc = mask_payload(stored)
    assert shown_doc["h"]["Accept"] == ["text/html"]
    assert shown_doc["mt"]["http_user"] == "alice"
    assert shown_doc["k"]["page"] == 2
    assert mask_payload(stored) != stored and json.loads(encode_request(request, None)) == stored


def test_a_form_body_stored_as_text_or_bytes_is_masked_in_its_form():
    # what FormRequest(formdata=...) makes (Scrapy 2.16 warns FormRequest is deprecated)
    form = Request(
        "http://h/login",
        method="POST",
        body="user=u&password=p1",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    stored = json.loads(encode_request(form, None))
    shown = mask_payload(stored)
    assert "p1" not in json.dumps(shown)
    assert type(shown["b"]) is type(stored["b"])  # noqa: E721 (the stored form is kept)


def test_every_log_record_is_masked_when_written(caplog):
    install_log_masking()
    logger = logging.getLogger("tests.masking")
    with caplog.at_level(logging.INFO):
        logger.info("connecting to %s", "redis://:pw1@h:6379/0")
        try:
            raise ValueError("refused: http://u:pw2@h/?token=t3")
        except ValueError:
            logger.exception("failed with %(a)s", {"a": "password=pw4"})
    assert "pw1" not in caplog.text and "pw2" not in caplog.text
    assert "t3" not in caplog.text and "pw4" not in caplog.text
    assert "redis://:***@h:6379/0" in caplog.text and "password=***" in caplog.text


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1]:8080/p?mail=a@b.com",
        "http://[2001:db8::1]/p?mail=a@b.com",
        "http://host:/p?mail=a@b.com",
    ],
)
def test_an_at_in_the_path_of_an_ipv6_or_portless_url_is_no_password(url):
    """Review: ``http://[::1]:8080/p?mail=a@b.com`` was shown as ``http://[:***@b.com``."""
    assert mask_url(url) == url


@pytest.mark.parametrize("run", ["a-", "a1", "1a", "Ab-Cd:", "password_", "a!b:", "u:p"])
def test_a_long_run_of_a_schemes_characters_is_masked_in_linear_time(run):
    """``"token " + "a-" * 40000`` took seconds: the URL pattern was tried at every letter
    of the run and scanned the rest of it each time. A ratio within one process: 16x the
    line is 16x the time where the pattern took 256x; the two sizes measured in turn, the
    best of seven each, and the bound at 64x, 4x from either (a busy machine slows the
    longer run more: 8x the line once measured 39x under a full test run, against 24x).
    Timed in the thread's CPU time, not the wall's: on a machine busy with other work the
    longer run was preempted more often (3 of these failed at a load average of 8)."""
    import time

    lines = {n: "token " + run * n for n in (2_500, 40_000)}
    times: dict[int, list[float]] = {n: [] for n in lines}
    for _ in range(7):
        for n, line in lines.items():
            start = time.thread_time()
            mask_text(line)
            times[n].append(time.thread_time() - start)
    small, large = min(times[2_500]), min(times[40_000])
    assert large < 64 * small, (small, large)
