"""The dashboard's page and API answer of a dead letter whose request holds a lone
surrogate: shown as its escape (``\\ud800``), never a 500."""

from __future__ import annotations

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from tests.test_cli_lone_surrogates import SurrogateSpider
from tests.test_dashboard_api import crawl, dashboard

#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


@deferred_f_from_coro_f
async def test_an_entry_with_a_lone_surrogate_is_shown_escaped(redis_url, site):
    await crawl(redis_url, site, SurrogateSpider)
    with dashboard(redis_url) as http:
        entries = http.get("/api/crawls/surrogates/dead").json()["entries"]
        assert len(entries) == 2
        for entry in entries:
            answer = http.get(f"/api/crawls/surrogates/dead/{entry['id']}")
            assert answer.status_code == 200, answer.text
            page = http.get(f"/crawls/surrogates/dead/{entry['id']}")
            assert page.status_code == 200
            assert "hunter2" not in answer.text + page.text
        shown = [http.get(f"/api/crawls/surrogates/dead/{e['id']}").json() for e in entries]
        notes = [s["request"].get("mt", {}).get("note") for s in shown]
        assert "caf\\udce9 \\ud800 au lait" in notes
