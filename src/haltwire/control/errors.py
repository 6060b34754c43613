"""What the control plane's rules answer instead of doing what was asked: ``Refused``.

One type for every refusal of the API (a lease, a credential, an intent, a bad request), so a
rule says what went wrong and the routes only write it: ``{"error": {"code", "message",
"retryable", ...}}`` with the status it names. The words agents read (``stopped``) come from
``haltwire.refusal``, the one place for them.
"""

from __future__ import annotations

from typing import Any

from haltwire import refusal
from haltwire.stops import Stopped


class Refused(Exception):
    """A refused request: its HTTP status, a code, one sentence, and any extra fields."""

    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra

    @property
    def retryable(self) -> bool:
        """Only an unavailable store clears by itself."""
        return self.status == 503

    def error(self) -> dict[str, Any]:
        """The ``error`` object of the answer (and of a refused run in a batched renewal)."""
        return {"code": self.code, "message": self.message, "retryable": self.retryable, **self.extra}


def stopped_by(hit: Stopped) -> Refused:
    """409 ``stopped``: an active stop matches (the gateway's sentence, without its words for a model)."""
    scope, stop = str(hit.scope), hit.stop
    said = refusal.stopped(scope, stop.stop_id, stop.reason)
    return Refused(409, "stopped", refusal.for_people(said), scope=scope, stop_id=stop.stop_id, reason=stop.reason)


def invalid(message: str) -> Refused:
    return Refused(422, "invalid_request", message)


def unavailable(exc: Exception) -> Refused:
    """503 ``registry_unavailable``, saying whether the request's write happened: ``written`` is
    ``"no"`` (nothing of it was recorded) or ``"unknown"`` (its commit's answer was lost:
    repeat it with the same ``Idempotency-Key`` to learn, or read before writing again)."""
    written = getattr(exc, "written", False)
    if written is None:
        said = "; the write may have been recorded: repeat the request with the same Idempotency-Key"
        return Refused(
            503, "registry_unavailable", f"the stop registry is unavailable: {exc}{said}", written="unknown"
        )
    said = "; nothing was written"
    return Refused(
        503, "registry_unavailable", f"the stop registry is unavailable: {exc}{said}", written="no"
    )
