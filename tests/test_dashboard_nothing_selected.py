"""A table's "Requeue selected" (or "Purge selected") with no row ticked: the
confirmation page says nothing is selected and leads back, as it does for a filter that
matches nothing (it was a 400 naming the form's internals), and nothing is done."""

from __future__ import annotations

from tests.test_dashboard_api import _url, dashboard, form_token, seed_dead


def test_acting_on_the_selected_rows_with_none_ticked_says_nothing_is_selected(redis_client):
    seed_dead(redis_client, 3, spider="few")
    with dashboard(_url(redis_client)) as http:
        csrf = form_token(http.get("/crawls/few/dead").text)
        for action in ("requeue", "purge"):
            page = http.post(f"/crawls/few/actions/{action}", data={"csrf": csrf, "scope": "ids"})
            assert page.status_code == 200, page.text
            assert "Nothing selected: nothing to do." in page.text
            assert 'href="/crawls/few/dead">Back' in page.text
        assert http.get("/api/crawls/few").json()["dead"] == 3
