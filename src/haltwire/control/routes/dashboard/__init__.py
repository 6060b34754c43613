"""The operators' dashboard, served under ``/dashboard/`` on the admin listener only.

Server-rendered pages (Jinja2, ``templates/``) and one small script (``static/``) for the live
panels; no build step and nothing from the network. A person signs in with an operator's or a
viewer's bearer token (``sessions``), reads through the rules the API's routes call
(``pages``, ``live``), and writes through them too (``actions``), as the signed-in identity,
with the API's roles: a viewer is shown no button that writes, and refused if it sends one.
"""

from __future__ import annotations

from typing import Final

from starlette.routing import BaseRoute, Mount, Route

from haltwire.control.routes.dashboard import actions, live, pages
from haltwire.control.routes.dashboard.panels import Board
from haltwire.control.routes.dashboard.sessions import PATH, Sessions

__all__ = ["PATH", "Board", "Sessions", "mount"]

#: The live stream's path: exempt from the admin listener's cap on requests in flight.
EVENTS: Final = f"{PATH}/events"


def mount() -> BaseRoute:
    """Every dashboard route, under ``/dashboard``."""
    return Mount(
        PATH,
        routes=[
            Route("/", pages.overview, methods=["GET"]),
            Route("/stop", pages.review_stop, methods=["GET"]),
            Route("/runs/{run_id}", pages.run_page, methods=["GET"]),
            Route("/audit", pages.audit_page, methods=["GET"]),
            Route("/static/{name}", pages.static_file, methods=["GET"]),
            Route("/events", live.events, methods=["GET"]),
            Route("/sign-in", actions.sign_in, methods=["POST"]),
            Route("/sign-out", actions.sign_out, methods=["POST"]),
            Route("/stops", actions.issue_stop, methods=["POST"]),
            Route("/stops/{stop_id}/clear", actions.clear_stop, methods=["POST"]),
            Route("/intents/{intent_id}/approve", actions.approve_intent, methods=["POST"]),
            Route("/intents/{intent_id}/reject", actions.reject_intent, methods=["POST"]),
        ],
    )
