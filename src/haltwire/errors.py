"""Exceptions: in a few words for logs and refusal messages, and out of their task groups."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx2


def describe(exc: BaseException) -> str:
    """An exception in a few words, for logs and ``UpstreamUnavailable``."""
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return describe(exc.exceptions[0])
    if isinstance(exc, TimeoutError):
        return "it did not answer in time"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def not_listening(exc: BaseException) -> bool:
    """Whether ``exc`` says its peer accepts no connection (yet): refused, or no route to it.
    A start waits such a peer out, so that the processes of a stack may start in any order."""
    if isinstance(exc, BaseExceptionGroup):
        return any(not_listening(e) for e in exc.exceptions)
    return isinstance(exc, httpx2.ConnectError | ConnectionRefusedError)


@contextlib.contextmanager
def unwrapped() -> Iterator[None]:
    """Re-raise a task group's lone exception as itself, not as an ``ExceptionGroup``.

    anyio wraps even one failure of a task group (or of the code inside its block) in a
    group, and nested task groups nest the groups; callers of a library expect
    ``except StopRequested`` to work.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        lone: BaseException = group
        while isinstance(lone, BaseExceptionGroup) and len(lone.exceptions) == 1:
            lone = lone.exceptions[0]  # groups nest when task groups do
        if isinstance(lone, Exception) and not isinstance(lone, BaseExceptionGroup):
            raise lone from None
        raise
