"""The gateway's call log (``[call_log]``): one JSON line per ``tools/call`` that reached the
pipeline, for ``haltwire tripwires test`` (``haltwire.tripwires.backtest``) to replay.

A record holds what the tripwires read of a call and nothing more: when (``ts``, ``ended``, and
``reads``, the times the tripwires' clock gave), who (``identity``, ``run``), the ``tool`` and its
``label``, how far the call got in the pipeline (``stage``: ``gate`` refused before the
tripwires, ``latch`` refused or failed before routing, ``routed`` refused at admission by a
ceiling, ``admitted``), the digest of its arguments (``args_sha256``, ``rules.digest``: key order
and spacing do not matter), the amounts at the money rules' paths (``amounts``), its outcome
(``ok``, ``error``, ``cancelled`` or a refusal code) with the digest of its result
(``result_sha256``, the repeated-results rule's normalization), and the tripwires that fired on it
(rule, mode, scope; a content rule's signal kinds, never their text). Raw arguments only with
``args = true``; never a result's text, never a token.

A model call (``haltwire.gateway.model_calls``) is recorded as a call to ``model:NAME`` (the name
its limits and rules know it by: the model, or ``PREFIX*``), with no arguments and no label; its
outcome is ``ok``, ``error`` (the provider's error answer), ``cancelled`` (the client went) or
the refusal's code, and ``usage`` holds what it used (``input``, ``output`` tokens and
``money_micros``), which a replay adds to the usage rules as the gateway did.

Cost per call: a record is appended to a buffer; digests, JSON and the file are a flush's work,
in a worker thread, every ``flush_s`` (and at shutdown). A crash loses at most the records of the
last ``flush_s`` (and at most ``max_buffered``: past it, records are dropped and counted, as
are records a failed write loses: the log never stops the gateway). The
file is created 0600; past ``max_bytes`` it is rotated like ``logging.handlers.RotatingFileHandler``
(``FILE.1`` .. ``FILE.<backups>``, the oldest deleted). Without ``[call_log]`` nothing of this runs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
from pydantic import Field

from haltwire.config import ConfigModel, Label
from haltwire.identity import Identity
from haltwire.refusal import Refusal
from haltwire.tripwires.detectors import result_text
from haltwire.tripwires.rules import digest, normalized_text
from haltwire.tripwires.usage import Spent
from haltwire.tripwires.writer import Trip

log = logging.getLogger("haltwire.calllog")


class CallLogSection(ConfigModel):
    """``[call_log]``."""

    path: str = Field(min_length=1)
    #: Rotate past this size, keeping this many old files (either 0: never rotated).
    max_bytes: int = Field(default=100_000_000, ge=0)
    backups: int = Field(default=5, ge=0)
    #: How often the buffer goes to the file: what a crash can lose.
    flush_s: float = Field(default=1.0, gt=0)
    max_buffered: int = Field(default=100_000, ge=1)
    #: Record the raw arguments too (they may hold personal data or secrets).
    args: bool = False


@dataclass
class Entry:
    """One call being recorded (``CURRENT`` while it runs)."""

    ts: float
    identity: Identity
    tool: str
    label: Label | None
    arguments: dict[str, Any] | None
    run: str | None = None
    stage: str = "gate"
    outcome: str | None = None
    result: dict[str, Any] | None = None
    ended: float = 0.0
    reads: list[float] = field(default_factory=list)
    fired: list[Trip] = field(default_factory=list)
    #: A model call's usage, once it has ended.
    usage: Spent | None = None


#: The call being recorded, in its task: the pipeline marks its stage, the tripwires their firings.
CURRENT: ContextVar[Entry | None] = ContextVar("haltwire_call", default=None)


def reached(stage: str) -> None:
    """Mark how far the current call got (when it is recorded)."""
    entry = CURRENT.get()
    if entry is not None:
        entry.stage = stage


def noted(trip: Trip) -> None:
    """A tripwire fired on the current call (when it is recorded)."""
    entry = CURRENT.get()
    if entry is not None:
        entry.fired.append(trip)


def recording(clock: Callable[[], float]) -> Callable[[], float]:
    """``clock``, with each time it gives to the current call's tripwires kept in its record."""

    def read() -> float:
        now = clock()
        entry = CURRENT.get()
        if entry is not None:
            entry.reads.append(now)
        return now

    return read


def outcome_of(result: dict[str, Any] | Refusal) -> tuple[str, dict[str, Any] | None]:
    if isinstance(result, Refusal):
        return result.code, None
    return ("error" if result.get("isError") else "ok"), result


def result_digest(tool: str, wire: dict[str, Any]) -> str:
    """The digest the repeated-results rule compares (``engine.Tripwires.settle``)."""
    return digest([tool, bool(wire.get("isError")), normalized_text(result_text(wire))])


def amounts_of(arguments: dict[str, Any] | None, paths: list[str]) -> dict[str, Any]:
    """The values at the money rules' paths (a non-number as None: it is unreadable either way)."""
    out: dict[str, Any] = {}
    for path in paths:
        value: Any = arguments or {}
        for part in path.split("."):
            if not isinstance(value, dict) or part not in value:
                break
            value = value[part]
        else:
            number = isinstance(value, int | float) and not isinstance(value, bool)
            out[path] = value if number else None
    return out


def firing(trip: Trip) -> dict[str, Any]:
    out: dict[str, Any] = {"rule": trip.rule, "mode": trip.mode, "scope": trip.scope}
    if trip.kind == "content":
        out["kinds"] = trip.figures.get("kinds", [])
    return out


class CallLog:
    def __init__(self, section: CallLogSection, money_paths: list[str], clock: Callable[[], float]) -> None:
        self.section = section
        self._paths = sorted(set(money_paths))
        self._clock = clock
        self._buffer: list[Entry] = []
        self.dropped = 0
        self._file: int | None = None
        self._size = 0
        self._lock = anyio.Lock()

    def begin(self, identity: Identity, tool: str, arguments: dict[str, Any] | None, label: Label | None) -> Entry:
        return Entry(self._clock(), identity, tool, label, arguments)

    def outcome(self, entry: Entry, result: dict[str, Any] | Refusal) -> None:
        """What the pipeline made of the call, as the tripwires are about to judge it: the
        record's outcome, and its ``ended`` (the time its judgement starts, for a replay)."""
        entry.ended = self._clock()
        entry.outcome, entry.result = outcome_of(result)

    def end(self, entry: Entry, result: dict[str, Any] | Refusal | None, outcome: str | None = None) -> None:
        """Queue the call's record (``result``: its outcome, unless ``outcome`` was told)."""
        if entry.outcome is None:
            entry.ended = self._clock()
            if result is None:
                entry.outcome = outcome
            else:
                entry.outcome, entry.result = outcome_of(result)
        if len(self._buffer) >= self.section.max_buffered:
            self.dropped += 1
            if self.dropped in (1, 10, 100) or self.dropped % 10_000 == 0:
                log.warning("call log: %d records dropped (the file is not keeping up)", self.dropped)
            return
        self._buffer.append(entry)

    def record(self, e: Entry) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ts": e.ts,
            "ended": e.ended,
            "identity": {"agent": e.identity.agent, "tenant": e.identity.tenant, "version": e.identity.version},
            "run": e.run,
            "tool": e.tool,
            "label": e.label,
            "stage": e.stage,
            "args_sha256": digest([e.tool, e.arguments or {}]),
            "outcome": e.outcome,
        }
        if self._paths and (amounts := amounts_of(e.arguments, self._paths)):
            out["amounts"] = amounts
        if e.result is not None:
            out["result_sha256"] = result_digest(e.tool, e.result)
        if e.reads:
            out["reads"] = e.reads
        if e.usage is not None:
            out["usage"] = {"input": e.usage.input, "output": e.usage.output, "money_micros": e.usage.money_micros}
        if e.fired:
            out["tripwires"] = [firing(t) for t in e.fired]
        if self.section.args:
            out["arguments"] = e.arguments
        return out

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Flush every ``flush_s`` until cancelled (``aclose`` flushes the rest)."""
        await anyio.to_thread.run_sync(self._open)
        task_status.started()
        while True:
            await anyio.sleep(self.section.flush_s)
            await self.flush()

    async def flush(self) -> None:
        async with self._lock:  # one writer of the file at a time (a flush, the last one)
            batch, self._buffer = self._buffer, []
            if not batch:
                return
            try:
                await anyio.to_thread.run_sync(self._write, batch)
            except OSError as exc:  # a full disk, say: the gateway goes on serving, without the log
                self.dropped += len(batch)
                log.error("call log: %d records not written (%s)", len(batch), exc)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self.flush()
        if self._file is not None:
            os.close(self._file)
            self._file = None

    def _open(self) -> None:
        fd = os.open(self.section.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.fchmod(fd, 0o600)  # whatever the umask, and an older file too
        self._file = fd
        self._size = os.fstat(fd).st_size

    def _write(self, batch: list[Entry]) -> None:
        if self._file is None:
            self._open()
        s = self.section
        for entry in batch:
            try:
                line = (json.dumps(self.record(entry), separators=(",", ":"), default=str) + "\n").encode()
            except (TypeError, ValueError, RuntimeError) as exc:  # arguments that cannot be written
                self.dropped += 1
                log.error("call log: a record of %s not written (%s)", entry.tool, exc)
                continue
            if s.max_bytes and s.backups and self._size and self._size + len(line) > s.max_bytes:
                self._rotate()
            assert self._file is not None
            os.write(self._file, line)
            self._size += len(line)

    def _rotate(self) -> None:
        assert self._file is not None
        os.close(self._file)
        self._file = None
        path, n = self.section.path, self.section.backups
        with contextlib.suppress(FileNotFoundError):
            os.remove(f"{path}.{n}")
        for i in range(n - 1, 0, -1):
            if Path(f"{path}.{i}").exists():
                os.replace(f"{path}.{i}", f"{path}.{i + 1}")
        os.replace(path, f"{path}.1")
        self._open()
