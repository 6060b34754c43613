"""The overview's live stream: each panel pushed again as server-sent events when it changes.

The panels are read again after every registry change this process hears of (``Plane.changed``:
its own writes, another process's or replica's) and every ``EVERY_S`` (runs and intents are
not registry changes); a panel is sent only when its HTML differs from the last sent. A
``tick`` event each look tells the page the stream is alive (the page calls itself stale when
it hears nothing); a ``problem`` event says the store failed, and the stream goes on trying; a
``signed-out`` event ends it when the session has.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Final

import anyio
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request
from starlette.responses import Response

from haltwire.control.errors import unavailable
from haltwire.control.routes.dashboard import panels
from haltwire.control.routes.dashboard.render import clock
from haltwire.control.routes.dashboard.sessions import NotSignedIn, signed_in
from haltwire.control.routes.dashboard.web import guarded
from haltwire.control.routes.wire import plane_of
from haltwire.store.registry import RegistryUnavailable

#: The longest wait between two looks.
EVERY_S: Final = 2.0
#: After a change, how long to wait for the rest of its burst before looking.
SETTLE_S: Final = 0.2


@guarded
async def events(request: Request) -> Response:
    plane = plane_of(request)
    board: panels.Board = request.app.state.dashboard_board
    try:
        signed_in(request, plane)  # refused before streaming
    except NotSignedIn as exc:
        # 401, not the sign-in page: an EventSource shows the page stale, then reconnects.
        raise NotSignedIn(str(exc) or "sign in first") from None

    async def stream() -> AsyncIterator[ServerSentEvent]:
        sent: dict[str, str] = {}
        since = time.monotonic()
        while True:
            changed = plane.changed  # taken before the read: a write after it wakes us
            try:
                caller, session = signed_in(request, plane)
            except NotSignedIn:
                yield ServerSentEvent("your session has ended", event="signed-out")
                return
            try:
                html = await board.look(plane, caller, session, since)
            except RegistryUnavailable as exc:
                yield ServerSentEvent(unavailable(exc).message, event="problem")
            else:
                for name, text in html.items():
                    if sent.get(name) != text:
                        sent[name] = text
                        yield ServerSentEvent(text, event=name)
                yield ServerSentEvent(clock(time.time()), event="tick")
            with anyio.move_on_after(EVERY_S):
                await changed.wait()
                # A burst of changes (a stop, the intents it cancels, a clear) is one look.
                await anyio.sleep(SETTLE_S)
            since = time.monotonic()

    return EventSourceResponse(stream(), ping=5, headers={"Cache-Control": "no-store"})

