"""What offering a request as a training sample costs the reactor thread.

Until the crawl has a compaction dictionary, every request a worker admits is offered as a
sample (up to 512), and a sample is masked first (its secrets become ``***``), at about
0.3 s a MB of meta. In a QA run a page whose 300 children carried 1 MB of meta each held a
worker's event loop 57 s, for samples the training never takes (over 512 bytes)."""

from __future__ import annotations

import base64
import os

import scrapy

from scrapy_ha.codec import encode_request, summary
from scrapy_ha.codec.compact import SAMPLE_MAX_BYTES
from scrapy_ha.codec.summary import SAMPLE_MASK_MAX_BYTES, training_sample
from scrapy_ha.store.dictionary import Compactor


class _Spider(scrapy.Spider):
    name = "samples"

    def child(self, response: object) -> None:
        pass


def _payload(**kwargs: object) -> bytes:
    spider = _Spider()
    return encode_request(scrapy.Request(callback=spider.child, **kwargs), spider)  # type: ignore[arg-type]


def test_a_request_of_large_meta_is_no_sample_and_is_not_masked(monkeypatch):
    masked: list[object] = []
    mask = summary.mask_payload
    monkeypatch.setattr(summary, "mask_payload", lambda doc: masked.append(doc) or mask(doc))
    blob = base64.b64encode(os.urandom(768 * 1024)).decode()
    payload = _payload(url="https://shop.example/p/1", meta={"blob": blob})
    assert len(payload) > SAMPLE_MASK_MAX_BYTES
    compactor = Compactor()
    compactor.sample(payload)
    assert compactor.samples == []
    assert compactor.offered == 1  # offered all the same: a crawl of large requests trains
    assert masked == []


def test_a_request_whose_secret_makes_it_large_is_still_a_masked_sample():
    token = "Bearer " + "t" * 1000  # a JWT-sized bearer token the request keeps
    payload = _payload(url="https://api.example/v1/items?page=2", headers={"Authorization": token})
    assert SAMPLE_MAX_BYTES < len(payload) <= SAMPLE_MASK_MAX_BYTES
    sample = training_sample(payload)
    assert sample and len(sample) <= SAMPLE_MAX_BYTES
    assert b"tttttttt" not in sample
