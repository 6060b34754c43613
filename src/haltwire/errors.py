"""Exceptions: in a few words for logs and refusal messages, and out of their task groups."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


def describe(exc: BaseException) -> str:
    """An exception in a few words, for logs and ``UpstreamUnavailable``."""
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return describe(exc.exceptions[0])
    if isinstance(exc, TimeoutError):
        return "it did not answer in time"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


@contextlib.contextmanager
def unwrapped() -> Iterator[None]:
    """Re-raise a task group's lone exception as itself, not as an ``ExceptionGroup``.

    anyio wraps even one failure of a task group (or of the code inside its block) in a
    group; callers of a library expect ``except StopRequested`` to work.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1 and isinstance(group.exceptions[0], Exception):
            raise group.exceptions[0] from None
        raise
