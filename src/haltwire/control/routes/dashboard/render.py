"""Pages from the dashboard's templates (Jinja2, autoescaped), with the headers every page gets.

The templates and the one script and style sheet are package data (``templates/``,
``static/``): no build step, no CDN, nothing fetched from the network.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from importlib.resources import files
from typing import Any, Final

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from starlette.responses import HTMLResponse, Response

#: Every page: nothing from elsewhere, never framed (a stop button must not be clickjacked),
#: never cached (a stale page shows stops that are gone).
HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    # Not no-referrer: under it, a form's POST says ``Origin: null``, which the CSRF check refuses.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
#: The static files served, and their types.
STATIC: Final = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}


def ago(at: float | None, now: float | None = None) -> str:
    """``at`` as "12 s ago", "3 min ago", "2 h ago", "4 d ago"."""
    if at is None:
        return ""
    seconds = max(0.0, (time.time() if now is None else now) - at)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return f"{int(seconds)} s ago"


def clock(at: float | None) -> str:
    """``at`` as a UTC time an operator reads: ``2026-12-03 03:04:05Z``."""
    if at is None:
        return ""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def when(at: float | None) -> Markup:
    """``at`` as a UTC time the page's script shows as an age ("12 s ago"): the panel's HTML
    stays the same from one look to the next, so it is pushed only when what it shows changes."""
    if at is None:
        return Markup("")
    return Markup('<time data-at="{:.3f}" title="{}">{}</time>').format(at, clock(at), clock(at))


_env = Environment(
    loader=PackageLoader("haltwire.control.routes.dashboard", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.filters["ago"] = ago
_env.filters["clock"] = clock
_env.filters["when"] = when


def fragment(name: str, **context: Any) -> str:
    """One template rendered to text (a panel the live stream pushes, or a whole page)."""
    return _env.get_template(name).render(**context)


def page(name: str, status: int = 200, **context: Any) -> HTMLResponse:
    return HTMLResponse(fragment(name, **context), status_code=status, headers=HEADERS)


def static(name: str) -> Response:
    kind = STATIC.get(name)
    if kind is None:
        return Response("not found", status_code=404, media_type="text/plain")
    body = files("haltwire.control.routes.dashboard").joinpath("static", name).read_bytes()
    return Response(body, media_type=kind, headers={**HEADERS, "Cache-Control": "no-cache"})
