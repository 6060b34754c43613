"""Helpers for tests of the control plane's API: a development config, its tokens, a control
plane served on loopback with its stores, the watch stream read event by event, the CLI."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx2
import psycopg
from psycopg import sql

from haltwire.control import create_app, parse_control_config
from haltwire.control.stores import Stores, open_stores
from haltwire.serve import serving

ROLES = ("operator", "tripwire", "gateway", "executor", "agent", "viewer")
TOKEN = {role: f"tok-{role}" for role in ROLES}


def config_dict(registry: dict[str, Any], heartbeat_s: float = 5.0) -> dict[str, Any]:
    identities = [
        {
            "name": f"{role}-1",
            "role": role,
            "token": TOKEN[role],
            **({"agent": "a1"} if role == "agent" else {}),
        }
        for role in ROLES
    ]
    return {
        "control": {"development": True, "heartbeat_s": heartbeat_s},
        "registry": registry,
        "identities": identities,
    }


def auth(role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN[role]}"}


@asynccontextmanager
async def control(
    tmp_path: Path,
    heartbeat_s: float = 5.0,
    registry: dict[str, Any] | None = None,
    *,
    identities: Sequence[dict[str, Any]] = (),
) -> AsyncIterator[tuple[httpx2.AsyncClient, Stores]]:
    section = registry or {"backend": "sqlite", "path": str(tmp_path / "control.db")}
    data = config_dict(section, heartbeat_s)
    data["identities"] += list(identities)
    config = parse_control_config(data)
    async with open_stores(config) as stores:
        async with serving(create_app(config, stores)) as url:
            async with httpx2.AsyncClient(base_url=url, timeout=10) as client:
                yield client, stores


async def issue(client: httpx2.AsyncClient, scope: str, role: str = "operator") -> dict[str, Any]:
    r = await client.post("/v1/stops", json={"scope": scope, "reason": "runaway"}, headers=auth(role))
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


class Events:
    """Reads server-sent events (and heartbeat comments) from one streaming response; the
    audit log's head, published as it moves, is kept in ``heads`` instead (unless ``heads=False``)."""

    def __init__(self, response: httpx2.Response, heads: bool = True) -> None:
        self._lines = response.aiter_lines()
        self._keep_heads = heads
        self.heads: list[dict[str, Any]] = []

    async def next(self, within: float = 5.0) -> dict[str, str]:
        event: dict[str, str] = {}
        with anyio.fail_after(within):
            async for line in self._lines:
                if not line:
                    if event.get("event") == "audit-head" and self._keep_heads:
                        self.heads.append(json.loads(event["data"]))
                        event = {}
                    if event:
                        return event
                    continue
                if line.startswith(":"):
                    return {"comment": line[1:].strip()}
                key, _, value = line.partition(":")
                event[key] = value.removeprefix(" ")
        raise AssertionError("the stream ended")

    async def next_change(self, within: float = 5.0) -> dict[str, str]:
        while "comment" in (event := await self.next(within)):
            pass
        return event


async def cli(*argv: str) -> int:
    from haltwire.cli import build_parser

    args = build_parser().parse_args(list(argv))
    status: int = await anyio.to_thread.run_sync(args.func, args)
    return status


def raw_sql(registry: dict[str, Any]) -> Callable[..., None]:
    """Runs SQL statements straight on a control plane's database, outside the control plane,
    as someone with database access would: each argument one statement, table names bare."""

    def sqlite(*statements: str) -> None:
        conn = sqlite3.connect(str(registry["path"]), isolation_level=None, timeout=10)
        try:
            for statement in statements:
                conn.execute(statement)
        finally:
            conn.close()

    def postgres(*statements: str) -> None:
        with psycopg.connect(registry["url"], autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(registry["schema"])))
            for statement in statements:
                conn.execute(statement.encode())

    return sqlite if registry["backend"] == "sqlite" else postgres


def failing_trigger(registry: dict[str, Any], table: str, event: str, message: str) -> tuple[str, ...]:
    """The statements that make every ``event`` (INSERT, UPDATE) on ``table`` fail with ``message``."""
    name = f"fail_{table}_{event.lower()}"
    if registry["backend"] == "sqlite":
        return (f"CREATE TRIGGER {name} BEFORE {event} ON {table} BEGIN SELECT RAISE(ABORT, '{message}'); END",)
    return (
        f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS "
        f"$$ BEGIN RAISE EXCEPTION '{message}'; END $$",
        f"CREATE TRIGGER {name} BEFORE {event} ON {table} FOR EACH ROW EXECUTE FUNCTION {name}()",
    )


def dropped_trigger(registry: dict[str, Any], table: str, event: str) -> tuple[str, ...]:
    name = f"fail_{table}_{event.lower()}"
    if registry["backend"] == "sqlite":
        return (f"DROP TRIGGER {name}",)
    return (f"DROP TRIGGER {name} ON {table}", f"DROP FUNCTION {name}()")
