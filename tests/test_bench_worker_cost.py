"""bench/worker_cost.py: its crawl-shaped requests are what a spider's links are, and the
shell compacts them as a crawl with a dictionary does."""

from __future__ import annotations

import json
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_crawl_shaped_requests_carry_a_referer_and_depth_and_are_compacted(capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import worker_cost

    from scrapy_ha.codec.compact import FRAME

    monkeypatch.setattr(worker_cost, "_SHAPE", ["crawl"])
    request = worker_cost._request("http://127.0.0.1:8000/item/1")
    assert request.headers[b"Referer"] == worker_cost.REFERER.encode()
    assert request.meta == {"depth": 1}
    s, _, _ = worker_cost.shell()
    worker_cost._compacting(s)
    assert s.enqueue_request(worker_cost._request("http://127.0.0.1:8000/item/2"))
    assert s.outbox.children[-1].payload[0] == FRAME  # compacted with the dictionary

    assert worker_cost.main(["--no-round", "--repeats", "1", "--requests", "200"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["shape"] == "bare" and result["shell_us_per_request"] > 0
    assert worker_cost._SHAPE == ["bare"]
