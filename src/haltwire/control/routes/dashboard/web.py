"""What every dashboard handler shares: its errors answered as pages in words, forms, roles.

A handler raises; ``guarded`` answers: ``NotHere`` 404 (not the admin listener),
``NotSignedIn`` the sign-in page (401 when a session ended), ``BadCsrf`` 403, a rule's
``Refused`` its status and message, a failing store 503 saying whether anything was written.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from haltwire.control.access import ROLES
from haltwire.control.config import Caller
from haltwire.control.errors import Refused, unavailable
from haltwire.control.routes.dashboard.render import page
from haltwire.control.routes.dashboard.sessions import BadCsrf, NotHere, NotSignedIn
from haltwire.control.routes.fields import ID_RULE, is_id
from haltwire.control.routes.wire import plane_of, read_body
from haltwire.store.registry import RegistryUnavailable

#: What a button does, as its ``ROLES`` action: a button shows only to roles that may press it.
BUTTONS: Final = {
    "stop": "stop.issue",
    "clear": "stop.clear",
    "approve": "intent.approve",
    "reject": "intent.reject",
}

Handler = Callable[..., Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class Buttons:
    """Which buttons a page shows (an attribute each: a dict's ``clear`` is its method to Jinja)."""

    stop: bool
    clear: bool
    approve: bool
    reject: bool


def may(caller: Caller) -> Buttons:
    """Which buttons ``caller`` sees: exactly the API's roles (``access.ROLES``)."""
    return Buttons(**{button: caller.role in ROLES[action] for button, action in BUTTONS.items()})


def problem(title: str, said: str, status: int, **context: Any) -> Response:
    return page("problem.html", status, title=title, problem=said, **context)


def guarded(handler: Handler) -> Handler:
    @functools.wraps(handler)
    async def answer(request: Request) -> Response:
        try:
            return await handler(request, **request.path_params)
        except NotHere:
            return PlainTextResponse("Not Found", status_code=404)
        except NotSignedIn as exc:
            said = str(exc)
            return page("sign_in.html", 401 if said else 200, problem=said or None)
        except BadCsrf as exc:
            return problem("Refused", f"Refused: {exc}; reload the page and try again.", 403)
        except Refused as exc:
            return problem("Refused" if exc.status < 500 else "Unavailable", exc.message, exc.status)
        except RegistryUnavailable as exc:
            refused = unavailable(exc)
            return problem("Unavailable", refused.message, refused.status)

    return answer


async def read_form(request: Request) -> dict[str, str]:
    """The URL-encoded form, bounded by ``[control] max_body_bytes``; a field given twice keeps
    its first value."""
    raw = await read_body(request, plane_of(request).config.control.max_body_bytes)
    form: dict[str, str] = {}
    for name, value in parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True):
        form.setdefault(name, value)
    return form


def checked_id(name: str, value: str) -> str:
    if not is_id(value):
        raise Refused(422, "invalid_request", f"{name}: {ID_RULE}")
    return value


def back_home() -> Response:
    return RedirectResponse("/dashboard/", status_code=303)
