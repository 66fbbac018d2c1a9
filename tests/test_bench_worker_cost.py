"""bench/worker_cost.py: its crawl-shaped requests are what a spider's links are, and the
shell has a dictionary as a crawl's does (it compacts those that go pending)."""

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
    s.handout.seal(s.outbox.children[-1:], keep=False)  # not handed out: it goes pending
    assert s.outbox.children[-1].payload[0] == FRAME  # compacted with the dictionary

    assert worker_cost.main(["--no-round", "--repeats", "1", "--requests", "200"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["shape"] == "bare" and result["shell_us_per_request"] > 0
    assert worker_cost._SHAPE == ["bare"]


def test_addon_shaped_requests_are_children_of_a_page_the_shell_holds_then_finishes(
    capsys, monkeypatch
):
    monkeypatch.syspath_prepend(str(BENCH))
    import worker_cost

    from scrapy_ha import metakeys
    from scrapy_ha.codec.compact import FRAME

    made = []
    shell = worker_cost.shell
    monkeypatch.setattr(worker_cost, "shell", lambda: made.append(shell()) or made[-1])
    monkeypatch.setattr(worker_cost, "_SHAPE", ["addon"])
    run = worker_cost.shell_run()
    s = made[0][0]
    sent = []
    seal = s.handout.seal
    monkeypatch.setattr(s.handout, "seal", lambda batch: sent.extend(batch) or seal(batch))
    run(worker_cost.PER_PAGE * 3)
    assert len(sent) == worker_cost.PER_PAGE * 3
    parents = {entry.parent for entry in sent}
    assert len(parents) == 3 and None not in parents  # each fenced by its page's lease
    # all handed out: stored leased to the worker as documents, not compacted
    assert all(entry.taken and entry.payload[0] != FRAME for entry in sent)
    assert not s.stats.get_value("ha/late_requests")  # its page was held
    assert s.inflight.pairs() == []  # and finished with its round
    request = worker_cost._request("http://127.0.0.1:8000/item/1", ("p1", "page"))
    assert request.meta == {"depth": 1, metakeys.PARENT: ("p1", "page")}

    assert worker_cost.main(["--no-round", "--repeats", "1", "--requests", "200"]) == 0
    assert json.loads(capsys.readouterr().out)["shape"] == "bare"
