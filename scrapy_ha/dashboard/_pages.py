"""What the dashboard's templates may call: numbers with thousands separators, one time
format, durations as people say them, and the label and meaning of every counter, state
and failure class (:mod:`scrapy_ha.ops.labels`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy_ha.dashboard._chart import WINDOWS, clock
from scrapy_ha.ops.display import LINE_DOMAINS, humanize, local_time, share_text
from scrapy_ha.ops.labels import STATES, class_label, counter_label

if TYPE_CHECKING:
    from fastapi import Request
    from fastapi.responses import HTMLResponse
    from fastapi.templating import Jinja2Templates

#: Seconds between two refreshes of a live page (overview, crawl) in a browser with
#: JavaScript: a crawl's numbers move visibly, and a page costs Redis a few milliseconds.
LIVE_SECONDS = 5
#: URL schemes a stored request's URL may be a link with.
LINKABLE = ("http", "https")
#: Domains an overview card names per reason work waits (a closed gate, a domain's limits),
#: the most waiting first, as many as a ``status`` line names: a crawl with a 429 from each
#: of 200 hosts drew a card of 200 lines; the crawl page's Waiting table lists them all.
CARD_DOMAINS = LINE_DOMAINS
#: The same without JavaScript (a ``<noscript>`` meta refresh): slower, since it reloads
#: the whole page while someone may be reading it.
PLAIN_SECONDS = 30


def thousands(value: Any) -> str:
    """``12,345``; a float with one decimal (``3.5``) or two below 10; ``–`` for none."""
    if value is None:
        return "–"
    if isinstance(value, float) and value != int(value):
        return f"{value:,.2f}" if abs(value) < 10 else f"{value:,.1f}"
    return f"{int(value):,}"


def percent(part: float, whole: float) -> str:
    """``61.7 %`` of *whole* (``–`` when it is 0)."""
    return share_text(part / whole, " ") if whole else "–"


def rate(value: float | None) -> str:
    """A share (``0.617``) as ``61.7 %``; ``–`` for none."""
    return "–" if value is None else share_text(value, " ")


def share(part: float, whole: float) -> str:
    """*part* of *whole* as a CSS width (``61.700%``)."""
    return f"{100 * part / whole:.3f}%" if whole else "0%"


def duration(seconds: float | None) -> str:
    return "–" if seconds is None else humanize(seconds)


def link(url: str | None) -> str | None:
    """*url* if a browser may follow it from the dashboard (http or https), else None:
    whoever writes to Redis must not put a ``javascript:`` link on an operator's page."""
    try:
        linkable = isinstance(url, str) and urlsplit(url).scheme.lower() in LINKABLE
    except ValueError:  # a host Python cannot read (http://[::1/), written to Redis by hand
        return None
    return url if linkable else None


def setup_templates(templates: Jinja2Templates) -> Jinja2Templates:
    """*templates* with the filters and names the pages use."""
    env = templates.env
    env.filters.update(
        time=local_time,
        n=thousands,
        duration=duration,
        clock=clock,
        percent=percent,
        rate=rate,
        share=share,
        link=link,
    )
    env.globals.update(
        counter_label=counter_label,
        class_label=class_label,
        STATES=STATES,
        WINDOWS=WINDOWS,
        LIVE_SECONDS=LIVE_SECONDS,
        PLAIN_SECONDS=PLAIN_SECONDS,
        CARD_DOMAINS=CARD_DOMAINS,
    )
    return templates


def render(request: Request, template: str, **context: Any) -> HTMLResponse:
    """*template* drawn for *request*, with the form token and the prefix every page shows."""
    templates: Jinja2Templates = request.app.state.templates
    context.update(csrf=request.state.csrf, prefix=request.app.state.prefix)
    return templates.TemplateResponse(request, template, context)
