"""Paging a table while workers change it: the entries taken out of the set meanwhile (due
retries a worker promoted, dead letters requeued or purged) move no page past rows it never
showed."""

from __future__ import annotations

from tests.cli_seed import delayed, lease_all
from tests.test_dashboard_api import _url, dashboard

#: Rows per page, and due retries a worker's sync promotes between two pages.
PAGE = 50


def test_due_retries_promoted_between_two_pages_make_the_next_page_skip_nothing(redis_client):
    url = _url(redis_client)
    due_now = [(f"http://shop.example/due/{i}", 0, "server") for i in range(PAGE)]
    later = [
        (f"http://shop.example/later/{i}", 3_600_000 + i * 1000, "server") for i in range(2 * PAGE)
    ]
    delayed(url, "shop", due_now + later)
    with dashboard(url) as http:
        first = http.get("/api/crawls/shop/delayed", params={"size": PAGE}).json()
        shown = [e["url"] for e in first["entries"]]
        assert sorted(shown) == sorted(u for u, _, _ in due_now)  # soonest first
        assert len(lease_all(url, "shop")) == PAGE  # a worker's sync takes the due ones
        cursor = first["next_cursor"]
        while cursor is not None:
            params = {"size": PAGE, "cursor": cursor}
            page = http.get("/api/crawls/shop/delayed", params=params).json()
            shown += [e["url"] for e in page["entries"]]
            cursor = page["next_cursor"]
    assert shown[PAGE:] == [u for u, _, _ in later]  # none skipped, in order
