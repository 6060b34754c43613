"""Dashboard sessions: a bearer token exchanged for a cookie, and the CSRF token of each write.

A session is held in the admin process's memory (one process serves the admin listener): a
restart signs everyone out, and sign-out ends it at once. The cookie holds only a random id;
the session keeps the token's SHA-256, so the caller is looked up again on every request and a
token removed from the config, or past its ``expires``, ends the session too.

Order of checks for a signed-in request (``signed_in``): the request came through the admin
listener (404 otherwise, so the agents' and enforcement ports serve no dashboard), the cookie
names a live session, its token is still an operator's or a viewer's; for a write
(``check_csrf``), then the form's or header's CSRF token is the session's, and an ``Origin``
sent is the dashboard's own.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

from haltwire.control.config import Caller
from haltwire.control.plane import Plane

COOKIE: Final = "haltwire_session"
PATH: Final = "/dashboard"
#: The roles that may sign in: people. A tripwire's token is a program's.
PEOPLE: Final = frozenset({"operator", "viewer"})
#: The ASGI scope key the admin listener sets (``routes.admin.AdminOnly``).
LISTENER_KEY: Final = "haltwire.listener"
#: Sessions kept at once; past it the oldest is ended.
MOST: Final = 1000


@dataclass
class Session:
    token_sha256: str
    csrf: str
    expires_at: float
    #: Messages to show once, on the next page (what a write did, in words).
    flash: list[str] = field(default_factory=list)


class NotSignedIn(Exception):
    """No live session: the sign-in page is answered instead (the message says why, or is "")."""


class NotHere(Exception):
    """The request did not come through the admin listener."""


class BadCsrf(Exception):
    """A write without the session's CSRF token, or from another origin."""


def _key(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class Sessions:
    """The live sessions of one admin process; ``clock`` for tests of expiry."""

    def __init__(self, session_s: float, clock: Callable[[], float] = time.time) -> None:
        self.session_s = session_s
        self.clock = clock
        self._by_key: dict[str, Session] = {}

    def open(self, token_sha256: str, caller: Caller) -> tuple[str, Session]:
        """A new session for ``caller``; answers the cookie's value and the session."""
        now = self.clock()
        ends = now + self.session_s
        if caller.expires_at is not None:
            ends = min(ends, caller.expires_at)
        if len(self._by_key) >= MOST:
            oldest = min(self._by_key, key=lambda k: self._by_key[k].expires_at)
            del self._by_key[oldest]
        session_id = secrets.token_urlsafe(32)
        session = Session(token_sha256, secrets.token_urlsafe(32), ends)
        self._by_key[_key(session_id)] = session
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        key = _key(session_id)
        session = self._by_key.get(key)
        if session is not None and self.clock() >= session.expires_at:
            del self._by_key[key]
            return None
        return session

    def close(self, session_id: str | None) -> None:
        if session_id:
            self._by_key.pop(_key(session_id), None)


def sessions_of(request: Request) -> Sessions:
    found: Sessions = request.app.state.dashboard_sessions
    return found


def require_admin_listener(request: Request) -> None:
    if request.scope.get(LISTENER_KEY) != "admin":
        raise NotHere


def signed_in(request: Request, plane: Plane) -> tuple[Caller, Session]:
    """The request's caller and session (the module's docstring); ``NotSignedIn`` otherwise."""
    require_admin_listener(request)
    sessions = sessions_of(request)
    session_id = request.cookies.get(COOKIE)
    session = sessions.get(session_id)
    if session is None:
        raise NotSignedIn("your session has ended; sign in again" if session_id else "")
    caller = plane.callers.get(session.token_sha256)
    if caller is None or caller.role not in PEOPLE or caller.expired(sessions.clock()):
        sessions.close(session_id)
        raise NotSignedIn("the token you signed in with is no longer valid; sign in with a current one")
    return caller, session


def check_csrf(request: Request, session: Session, form: dict[str, str]) -> None:
    """``BadCsrf`` unless the write carries the session's CSRF token and, when the browser says
    where it comes from, comes from this dashboard's origin."""
    sent = form.get("csrf") or request.headers.get("x-csrf-token") or ""
    if not hmac.compare_digest(sent.encode(), session.csrf.encode()):
        raise BadCsrf("this form was not sent by a page of this dashboard's session (no valid CSRF token)")
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host", ""):
        raise BadCsrf(f"this form was sent from another site ({origin}), not this dashboard")


def set_cookie(response: Response, request: Request, session_id: str, session: Session, now: float) -> None:
    response.set_cookie(
        COOKIE,
        session_id,
        max_age=max(1, int(session.expires_at - now)),
        path=PATH,
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )


def clear_cookie(response: Response, request: Request) -> None:
    response.delete_cookie(
        COOKIE, path=PATH, secure=request.url.scheme == "https", httponly=True, samesite="strict"
    )
