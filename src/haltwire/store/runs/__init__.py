"""Runs and their checkpoints: what the control plane's lease desk grants leases to.

A run is registered once (by the agent identity that owns it) and ended at most once; its
scopes (``run:``, ``agent:``, ``tenant:``, ``version:``, ``global``) are what a stop must match
to refuse its lease. A checkpoint is a JSON object a run saves so that a later run can resume
from it; each run's checkpoints are numbered 1, 2, ... in the order they were saved.

The tables live in the registry's database (the same SQLite file, the same PostgreSQL
schema). The DDL and the queries are written once here, with ``?`` placeholders and
``{runs}`` / ``{checkpoints}`` for the table names; ``tables.SqlRunStore`` runs them on either
backend. Failures raise ``RegistryUnavailable``, like the registry's.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from haltwire.scope import Scope, run_scopes
from haltwire.store.registry import RegistryUnavailable
from haltwire.store.sql import row_of

#: The columns of one run row, in this order, in every backend.
COLUMNS: Final = (
    "run_id",
    "agent",
    "tenant",
    "version",
    "tools",
    "agent_class",
    "registered_by",
    "registered_at",
    "resumed_from",
    "ended_at",
)
CHECKPOINT_COLUMNS: Final = ("run_id", "seq", "data", "saved_at")

Row = Sequence[Any]


class RunExists(Exception):
    """A run with this id was registered before; run ids are never reused."""


class UnknownRun(LookupError):
    """No run has this id."""


@dataclass(frozen=True, slots=True)
class RunRecord:
    run_id: str
    agent: str
    tenant: str
    version: str
    tools: tuple[str, ...]
    agent_class: str
    registered_by: str
    registered_at: float
    resumed_from: str | None = None
    ended_at: float | None = None

    @property
    def ended(self) -> bool:
        return self.ended_at is not None

    @property
    def scopes(self) -> frozenset[Scope]:
        """The scopes a stop must match to refuse this run's lease (never its tools)."""
        return run_scopes(self.run_id, self.agent, self.tenant, self.version)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    run_id: str
    seq: int
    data: dict[str, Any]
    saved_at: float


class RunStore(Protocol):
    async def register(self, run: RunRecord) -> RunRecord:
        """Record a new run. Raises ``RunExists`` if its id was ever registered."""
        ...

    async def get(self, run_id: str) -> RunRecord | None: ...

    async def get_many(self, run_ids: Sequence[str]) -> dict[str, RunRecord]:
        """The runs among ``run_ids`` that exist, by id: one query for a batched renewal."""
        ...

    async def list(self, limit: int = 100) -> list[RunRecord]:
        """The most recently registered runs, newest first."""
        ...

    async def end(self, run_id: str, at: float) -> RunRecord:
        """Mark the run ended at ``at`` (the first end wins). Raises ``UnknownRun``."""
        ...

    async def save_checkpoint(self, run_id: str, data: dict[str, Any], at: float) -> Checkpoint:
        """Save the run's next checkpoint (seq 1, 2, ...). Raises ``UnknownRun``."""
        ...

    async def latest_checkpoint(self, run_id: str) -> Checkpoint | None: ...

    async def note_grants(self, grants: dict[str, tuple[float, float]]) -> None:
        """Keep each run's latest lease grant (run id to its ``(granted_at, expires_at)``), a
        transaction per ``GRANTS_PER_STATEMENT``."""

    async def grants(self, run_ids: Sequence[str]) -> dict[str, tuple[float, float]]:
        """The latest grant kept for each of ``run_ids`` that has one."""
        ...

    async def aclose(self) -> None: ...


# -- shared by the backends -------------------------------------------------------------------

_COLS = ", ".join(COLUMNS)
_CP_COLS = ", ".join(CHECKPOINT_COLUMNS)

#: Both backends accept these type names (SQLite maps them to INTEGER / REAL affinity).
DDL: Final = (
    """CREATE TABLE IF NOT EXISTS {runs} (
    run_id        TEXT PRIMARY KEY,
    agent         TEXT NOT NULL,
    tenant        TEXT NOT NULL,
    version       TEXT NOT NULL,
    tools         TEXT NOT NULL,
    agent_class   TEXT NOT NULL,
    registered_by TEXT NOT NULL,
    registered_at DOUBLE PRECISION NOT NULL,
    resumed_from  TEXT,
    ended_at      DOUBLE PRECISION
)""",
    "CREATE INDEX IF NOT EXISTS runs_newest ON {runs} (registered_at)",
    """CREATE TABLE IF NOT EXISTS {checkpoints} (
    run_id   TEXT NOT NULL,
    seq      BIGINT NOT NULL,
    data     TEXT NOT NULL,
    saved_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (run_id, seq)
)""",
    # Each run's latest lease grant, written a batch at a time (``note_grants``): its age is
    # what an operator reads to tell a live run from one that stopped renewing.
    """CREATE TABLE IF NOT EXISTS {lease_grants} (
    run_id     TEXT PRIMARY KEY,
    granted_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL
)""",
)

QUERIES: Final = {
    # A duplicate id inserts nothing and returns no row: RunExists, without a driver error.
    "register": f"INSERT INTO {{runs}} ({_COLS}) VALUES ({', '.join('?' for _ in COLUMNS)}) "
    "ON CONFLICT (run_id) DO NOTHING RETURNING run_id",
    "get": f"SELECT {_COLS} FROM {{runs}} WHERE run_id = ?",
    # Completed per backend (``SqlRunStore._any_of``): SQLite with "(?, ?, ...)", PostgreSQL an array.
    "get_many": f"SELECT {_COLS} FROM {{runs}} WHERE run_id IN",
    "list": f"SELECT {_COLS} FROM {{runs}} ORDER BY registered_at DESC, run_id DESC LIMIT ?",
    "end": f"UPDATE {{runs}} SET ended_at = COALESCE(ended_at, ?) WHERE run_id = ? RETURNING {_COLS}",
    "exists": "SELECT 1 FROM {runs} WHERE run_id = ?",
    "next_seq": "SELECT COALESCE(MAX(seq), 0) + 1 FROM {checkpoints} WHERE run_id = ?",
    "save": f"INSERT INTO {{checkpoints}} ({_CP_COLS}) VALUES (?, ?, ?, ?)",
    "latest": f"SELECT {_CP_COLS} FROM {{checkpoints}} WHERE run_id = ? ORDER BY seq DESC LIMIT 1",
    # Completed with "(?, ?, ?), ..." per batch; a grant older than the one kept changes nothing.
    "note_grants": "INSERT INTO {lease_grants} (run_id, granted_at, expires_at) VALUES",
    "note_grants_tail": "ON CONFLICT (run_id) DO UPDATE SET granted_at = excluded.granted_at, "
    "expires_at = excluded.expires_at WHERE excluded.granted_at > {lease_grants}.granted_at",
    "grants": "SELECT run_id, granted_at, expires_at FROM {lease_grants} WHERE run_id IN",
}

#: Grants written per statement and transaction: on SQLite a few milliseconds of the write lock,
#: the longest a stop waits for them.
GRANTS_PER_STATEMENT: Final = 100


def new_run_id() -> str:
    return "run_" + secrets.token_hex(8)


def as_row(run: RunRecord) -> tuple[object, ...]:
    return row_of(run, COLUMNS, tools=lambda tools: json.dumps(list(tools)))


def from_row(row: Row) -> RunRecord:
    run_id, agent, tenant, version, tools, agent_class, by, at, resumed_from, ended_at = row
    return RunRecord(
        run_id=str(run_id),
        agent=str(agent),
        tenant=str(tenant),
        version=str(version),
        tools=tuple(json.loads(tools)),
        agent_class=str(agent_class),
        registered_by=str(by),
        registered_at=float(at),
        resumed_from=None if resumed_from is None else str(resumed_from),
        ended_at=None if ended_at is None else float(ended_at),
    )


def checkpoint_from_row(row: Row) -> Checkpoint:
    run_id, seq, data, saved_at = row
    return Checkpoint(str(run_id), int(seq), json.loads(data), float(saved_at))


def checkpoint_data(data: dict[str, Any]) -> str:
    """The stored text of a checkpoint; refuses what is not a JSON object."""
    if not isinstance(data, dict):
        raise ValueError("a checkpoint is a JSON object")
    return json.dumps(data, separators=(",", ":"))


def registered(row: Row | None, run: RunRecord) -> RunRecord:
    """The run, if the insert returned its row; else ``RunExists``."""
    if row is None:
        raise RunExists(f"a run with the id {run.run_id} was registered before")
    return run


def ended(row: Row | None, run_id: str) -> RunRecord:
    if row is None:
        raise UnknownRun(run_id)
    return from_row(row)


__all__ = [
    "Checkpoint",
    "RegistryUnavailable",
    "RunExists",
    "RunRecord",
    "RunStore",
    "UnknownRun",
    "new_run_id",
]
