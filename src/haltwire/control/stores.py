"""Opening the registry, the audit log, the run store, the credential map, the intent store, the
trip store and the page outbox a control-plane config names, as one unit: one database (``Db``),
so that a write and its audit record commit in one transaction (``Stores.db.write()``); and the
audit log's key."""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from haltwire.config import ConfigError, from_env
from haltwire.control.config import MIN_AUDIT_KEY, ControlConfig
from haltwire.store.audit import AuditLog
from haltwire.store.credentials import CredentialStore
from haltwire.store.intents import IntentStore
from haltwire.store.pages import PageStore
from haltwire.store.registry import Registry
from haltwire.store.runs import RunStore
from haltwire.store.sql import Db, Tables
from haltwire.store.trips import TripStore


@dataclass(slots=True)
class Stores:
    registry: Registry
    audit: AuditLog
    runs: RunStore
    credentials: CredentialStore
    intents: IntentStore
    #: What the whole-run rules decided (escalations, runs past their wall clock).
    trips: TripStore
    #: Pages owed to receivers (``[[notify]]``), written with the change they report.
    pages: PageStore
    #: The database every store above writes to: ``db.write()`` makes their writes one transaction.
    db: Db


@asynccontextmanager
async def open_stores(config: ControlConfig) -> AsyncIterator[Stores]:
    """All the stores in one place: the SQLite file, or the PostgreSQL schema; the audit log
    keyed with ``audit_key(config)``."""
    key = audit_key(config)
    section = config.registry
    if section.backend == "sqlite":
        from haltwire.store.audit.sqlite import SqliteAuditLog as Audit
        from haltwire.store.credentials.sqlite import SqliteCredentialStore as Credentials
        from haltwire.store.intents.sqlite import SqliteIntentStore as Intents
        from haltwire.store.pages.sqlite import SqlitePageStore as Pages
        from haltwire.store.registry.sqlite import SqliteRegistry as Changes
        from haltwire.store.runs.sqlite import SqliteRunStore as Runs
        from haltwire.store.sqlite import SqliteDb
        from haltwire.store.trips.sqlite import SqliteTripStore as Trips

        tables = _tables(
            Changes.TABLES, Audit.TABLES, Runs.TABLES, Credentials.TABLES, Intents.TABLES, Trips.TABLES,
            Pages.TABLES,
        )
        db: Db = await SqliteDb.open(section.path, tables)
    else:
        from haltwire.store.audit.postgres import PostgresAuditLog as Audit  # type: ignore[assignment]
        from haltwire.store.credentials.postgres import (  # type: ignore[assignment]
            PostgresCredentialStore as Credentials,
        )
        from haltwire.store.intents.postgres import PostgresIntentStore as Intents  # type: ignore[assignment]
        from haltwire.store.pages.postgres import PostgresPageStore as Pages  # type: ignore[assignment]
        from haltwire.store.postgres import PostgresDb
        from haltwire.store.registry.postgres import PostgresRegistry as Changes  # type: ignore[assignment]
        from haltwire.store.runs.postgres import PostgresRunStore as Runs  # type: ignore[assignment]
        from haltwire.store.trips.postgres import PostgresTripStore as Trips  # type: ignore[assignment]

        tables = _tables(
            Changes.TABLES, Audit.TABLES, Runs.TABLES, Credentials.TABLES, Intents.TABLES, Trips.TABLES,
            Pages.TABLES,
        )
        name = f"haltwire-control-{section.schema_}"[:63]  # which replica's schema, in pg_stat_activity
        db = await PostgresDb.open(section.url, section.schema_, 5.0, name, tables)
    try:
        stores = Stores(Changes(db), Audit(db, key), Runs(db), Credentials(db), Intents(db), Trips(db), Pages(db), db)
        await stores.audit.backfill()  # a database made before the audit log's index by run
        yield stores
    finally:
        await db.aclose()


def _tables(*parts: Tables) -> Tables:
    # Named as the registry: its NOTIFY channel and failures ("registry store failed: ...").
    return Tables.union("registry", "registry", *parts)


def audit_key(config: ControlConfig) -> bytes:
    """The audit log's key, as ``[audit]`` says (``AuditSection``); ``ConfigError`` when it is
    missing or shorter than ``MIN_AUDIT_KEY`` characters."""
    section, registry = config.audit, config.registry
    if section.key is not None:
        return section.key.encode()
    if section.key_env is not None:
        value = from_env("audit.key_env", section.key_env).strip()
        return _long_enough(value, f"the environment variable {section.key_env}")
    path = section.key_file
    if path is None:
        if registry.backend == "postgres":  # development only: the config refuses it otherwise
            seed = f"haltwire development audit key {registry.url} {registry.schema_}"
            return hashlib.sha256(seed.encode()).hexdigest().encode()
        path = registry.path.with_name(registry.path.name + ".audit-key")
        _make_key_file(path)
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"audit.key_file: cannot read {path}: {exc.strerror}") from None
    return _long_enough(text, str(path))


def _long_enough(text: str, where: str) -> bytes:
    if len(text) < MIN_AUDIT_KEY:
        raise ConfigError(f"audit: the key in {where} is shorter than {MIN_AUDIT_KEY} characters")
    return text.encode()


def _make_key_file(path: Path) -> None:
    """A new random key at ``path``, readable by its owner only; nothing if one is there. Written
    whole to a temporary file first and linked into place, so a crash never leaves half a key."""
    if path.exists():
        return
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32) + "\n")
            out.flush()
            os.fsync(out.fileno())
        with contextlib.suppress(FileExistsError):  # another process made one first: keep it
            os.link(tmp, path)
    except OSError as exc:
        raise ConfigError(f"audit: cannot create the key file {path}: {exc.strerror}") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
