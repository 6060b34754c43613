"""Opening the registry, the audit log, the run store, the credential map and the intent store a
control-plane config names, as one unit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from haltwire.control.config import RegistrySection
from haltwire.store.audit import AuditLog
from haltwire.store.credentials import CredentialStore
from haltwire.store.intents import IntentStore
from haltwire.store.registry import Registry
from haltwire.store.runs import RunStore


@dataclass(slots=True)
class Stores:
    registry: Registry
    audit: AuditLog
    runs: RunStore
    credentials: CredentialStore
    intents: IntentStore


@asynccontextmanager
async def open_stores(section: RegistrySection) -> AsyncIterator[Stores]:
    """All the stores in one place: the SQLite file, or the PostgreSQL schema."""
    async with AsyncExitStack() as stack:
        registry: Registry
        audit: AuditLog
        runs: RunStore
        credentials: CredentialStore
        intents: IntentStore
        if section.backend == "sqlite":
            from haltwire.store.audit.sqlite import SqliteAuditLog
            from haltwire.store.credentials.sqlite import SqliteCredentialStore
            from haltwire.store.intents.sqlite import SqliteIntentStore
            from haltwire.store.registry.sqlite import SqliteRegistry
            from haltwire.store.runs.sqlite import SqliteRunStore

            registry = await SqliteRegistry.open(section.path)
            stack.push_async_callback(registry.aclose)
            audit = await SqliteAuditLog.open(section.path)
            stack.push_async_callback(audit.aclose)
            runs = await SqliteRunStore.open(section.path)
            stack.push_async_callback(runs.aclose)
            credentials = await SqliteCredentialStore.open(section.path)
            stack.push_async_callback(credentials.aclose)
            intents = await SqliteIntentStore.open(section.path)
        else:
            from haltwire.store.audit.postgres import PostgresAuditLog
            from haltwire.store.credentials.postgres import PostgresCredentialStore
            from haltwire.store.intents.postgres import PostgresIntentStore
            from haltwire.store.registry.postgres import PostgresRegistry
            from haltwire.store.runs.postgres import PostgresRunStore

            registry = await PostgresRegistry.open(section.url, schema=section.schema_)
            stack.push_async_callback(registry.aclose)
            audit = await PostgresAuditLog.open(section.url, schema=section.schema_)
            stack.push_async_callback(audit.aclose)
            runs = await PostgresRunStore.open(section.url, schema=section.schema_)
            stack.push_async_callback(runs.aclose)
            credentials = await PostgresCredentialStore.open(section.url, schema=section.schema_)
            stack.push_async_callback(credentials.aclose)
            intents = await PostgresIntentStore.open(section.url, schema=section.schema_)
        stack.push_async_callback(intents.aclose)
        yield Stores(registry, audit, runs, credentials, intents)
