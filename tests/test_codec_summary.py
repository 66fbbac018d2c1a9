"""What the dead-letter queue reads of a stored request: `describe` and `reset_attempts`,
on payloads the codec wrote and on payloads nobody should have written; and the rule that
only the codec knows the stored document's field names."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import scrapy
from scrapy.http import JsonRequest

from scrapy_ha import metakeys
from scrapy_ha.codec import decode_request, describe, encode_request, reset_attempts
from scrapy_ha.codec import document as stored

ROOT = Path(__file__).resolve().parent.parent


class SummarySpider(scrapy.Spider):
    name = "summary"

    def parse(self, response):
        pass

    def parse_item(self, response):
        pass

    def on_error(self, failure):
        pass


SPIDER = SummarySpider()


@pytest.mark.filterwarnings("ignore:scrapy.http.FormRequest is deprecated")  # (Scrapy 2.16)
def test_describe_reads_what_the_codec_wrote():
    request = scrapy.FormRequest(
        "http://shop.test/cart?x=1",
        formdata={"sku": "A-1"},
        callback=SPIDER.parse_item,
        errback=SPIDER.on_error,
        priority=-3,
    )
    summary = describe(encode_request(request, SPIDER))
    assert summary.url == "http://shop.test/cart?x=1"
    assert (summary.method, summary.priority) == ("POST", -3)
    assert (summary.callback, summary.errback) == ("parse_item", "on_error")
    assert summary.body == b"sku=A-1"
    plain = describe(encode_request(scrapy.Request("http://shop.test/"), SPIDER))
    assert (plain.method, plain.priority, plain.callback, plain.body) == ("GET", 0, None, b"")


def test_describe_never_raises_on_what_it_cannot_read():
    for payload in (None, b"", b"not json", b"[1, 2]", b'"text"', b"{", "\udcff"):
        summary = describe(payload)
        assert summary.url is None and summary.document == {} and summary.body == b""
    odd = describe(json.dumps({"v": 1, "u": 5, "m": 7, "p": "high", "b": {"__b": "%%"}}))
    assert (odd.url, odd.method, odd.priority, odd.body) == (None, "GET", 0, b"")


def test_printable_masks_the_password_and_leaves_the_body_out():
    request = scrapy.Request(
        "http://shop.test/",
        method="PUT",
        body=b"secret body",
        meta={"http_user": "alice", "http_pass": "hunter2"},
    )
    summary = describe(encode_request(request, SPIDER))
    shown = json.dumps(summary.printable())
    assert "hunter2" not in shown and "alice" in shown and "http://shop.test/" in shown
    assert "secret body" not in shown and "c2VjcmV0IGJvZHk" not in shown  # nor its base64
    assert summary.document[stored.META]["http_pass"] == "hunter2"  # the stored one untouched


@pytest.mark.parametrize(
    "meta",
    [
        {"depth": 2},  # plain string keys
        {"depth": 2, 7: "seven"},  # a key that is not a string: the tagged form
    ],
)
def test_reset_attempts_forgets_past_attempts_and_keeps_the_rest(meta):
    attempts = {
        metakeys.RETRIES: {"server": 2},
        metakeys.HISTORY: [{"t": 1, "outcome": "HTTP 503"}],
    }
    request = JsonRequest(
        "http://shop.test/api",
        data={"q": 1},
        meta={**meta, **attempts},
        callback=SPIDER.parse_item,
        priority=4,
    )
    payload = encode_request(request, SPIDER)
    reset = reset_attempts(payload)
    again = decode_request(reset, SPIDER)
    assert again.meta == meta
    assert (again.url, again.body, again.priority) == (request.url, request.body, 4)
    assert type(again) is JsonRequest and again.callback.__name__ == "parse_item"
    assert describe(reset).priority == 4


@pytest.mark.parametrize("other", [{"depth": 2}, {"depth": 2, 7: "seven"}])
def test_reset_attempts_gives_a_revisited_url_its_failed_visits_again(other):
    # a dead letter written by a path that did not reset it (a poison lease, an older
    # worker): a requeue that kept "f" would dead-letter it again at its first failure
    state = {"i": 60, "n": 4, "c": 1, "e": '"v1"', "f": 3}
    request = scrapy.Request("http://shop.test/", meta={**other, metakeys.REVISIT_STATE: state})
    again = decode_request(reset_attempts(encode_request(request, SPIDER)), SPIDER)
    kept = {k: v for k, v in state.items() if k != "f"}
    assert again.meta == {**other, metakeys.REVISIT_STATE: kept}


def test_reset_attempts_drops_an_emptied_meta_and_keeps_what_it_cannot_read():
    request = scrapy.Request("http://shop.test/", meta={metakeys.RETRIES: {"gone": 1}})
    reset = reset_attempts(encode_request(request, SPIDER))
    assert reset == encode_request(scrapy.Request("http://shop.test/"), SPIDER)
    for unreadable in (b"not json", b"[1]", b""):
        assert reset_attempts(unreadable) == unreadable
    odd = b'{"v":1,"u":"x","mt":{"__d":[3,[{}],["ha_retries",1],[7,"x"]]}}'
    assert json.loads(reset_attempts(odd))["mt"]["__d"] == [3, [{}], [7, "x"]]


# --------------------------------------------------------------------------- one owner


#: The stored document's field names and tags: the codec's own business.
CODEC_NAMES = {
    value
    for name, value in vars(stored).items()
    if name.isupper() and isinstance(value, str) and name != "STORABLE"
} | {key for _attr, key, _default in stored.FIELDS}


def codec_names_read(source: str) -> set[str]:
    """Codec field names *source* reads from a dict: ``d["u"]``, ``d.get("m")``,
    ``"mt" in d``, ``k != "b"``, ``d.pop("b")``; and any string that is one of the codec's tags."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        keys: list[ast.expr] = []
        if isinstance(node, ast.Subscript):
            keys = [node.slice]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("get", "pop", "setdefault") and node.args:
                keys = [node.args[0]]
        elif isinstance(node, ast.Compare):
            keys = [node.left, *node.comparators]
        elif isinstance(node, ast.Constant) and str(node.value).startswith("__"):
            keys = [node]
        found |= {k.value for k in keys if isinstance(k, ast.Constant)} & CODEC_NAMES
    return found


@pytest.mark.parametrize("module", ["deadletters/dlq.py", "cli/dlq.py"])
def test_only_the_codec_knows_the_stored_field_names(module):
    source = (ROOT / "scrapy_ha" / module).read_text()
    assert codec_names_read(source) == set(), f"{module} reads the codec's fields"


def test_the_field_name_check_finds_a_field_read():
    assert codec_names_read('def f(doc):\n    return doc.get("m", "GET")\n') == {"m"}
    assert codec_names_read('raw = doc["b"]\nif "__b" in raw: pass\n') == {"b", "__b"}
    assert codec_names_read('shown = {k: v for k, v in doc.items() if k != "b"}\n') == {"b"}
    assert codec_names_read('p.add_argument("--class", dest="cls")\n') == set()


def test_reset_attempts_forgets_the_logins_a_page_met():
    """A page dead-lettered by ``login_once``'s ``LoginFailed`` carries its count of logins
    met: requeued with it, it failed again at once (a review: 18 pages requeued after the
    session was fixed, 18 dead-lettered again, none fetched)."""
    url = "http://shop.test/page/7"
    request = scrapy.Request(
        "http://shop.test/login?next=/page/7",
        meta={"cookiejar": 1, "redirect_urls": [url], metakeys.LOGINS_MET: [url, 5]},
        callback=SPIDER.parse_item,
    )
    again = decode_request(reset_attempts(encode_request(request, SPIDER)), SPIDER)
    assert again.meta == {"cookiejar": 1, "redirect_urls": [url]}
