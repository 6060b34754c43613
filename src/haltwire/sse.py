"""Reading a ``text/event-stream`` (server-sent events): the watch stream's wire format.

Shared by every follower of ``/v1/watch``: the gateway and credential verifiers
(``haltwire.watch``) and the runtime SDK (``haltwire.runtime``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final

#: The comment the control plane sends once a watch has replayed every missed change: only from
#: there may a follower count itself current.
CAUGHT_UP: Final = "caught-up"


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One server-sent event (``kind``, ``data``, ``id``), or a comment line (``comment``)."""

    kind: str = "message"
    data: str = ""
    id: str | None = None
    comment: str | None = None


async def sse_events(lines: AsyncIterator[str]) -> AsyncIterator[SseEvent]:
    """The events and comments of a ``text/event-stream``, from its lines."""
    event: dict[str, str] = {}
    async for line in lines:
        if line.startswith(":"):
            yield SseEvent(comment=line[1:].strip())
        elif line:
            key, _, value = line.partition(":")
            event[key] = value.removeprefix(" ")
        elif event:
            yield SseEvent(event.get("event", "message"), event.get("data", ""), event.get("id"))
            event = {}
