"""Opening the registry and the audit log a control-plane config names, as one unit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from haltwire.control.config import RegistrySection
from haltwire.store.audit import AuditLog
from haltwire.store.registry import Registry


@dataclass(slots=True)
class Stores:
    registry: Registry
    audit: AuditLog


@asynccontextmanager
async def open_stores(section: RegistrySection) -> AsyncIterator[Stores]:
    """Both stores in one place: the SQLite file, or the PostgreSQL schema."""
    async with AsyncExitStack() as stack:
        registry: Registry
        audit: AuditLog
        if section.backend == "sqlite":
            from haltwire.store.audit.sqlite import SqliteAuditLog
            from haltwire.store.registry.sqlite import SqliteRegistry

            registry = await SqliteRegistry.open(section.path)
            stack.push_async_callback(registry.aclose)
            audit = await SqliteAuditLog.open(section.path)
        else:
            from haltwire.store.audit.postgres import PostgresAuditLog
            from haltwire.store.registry.postgres import PostgresRegistry

            registry = await PostgresRegistry.open(section.url, schema=section.schema_)
            stack.push_async_callback(registry.aclose)
            audit = await PostgresAuditLog.open(section.url, schema=section.schema_)
        stack.push_async_callback(audit.aclose)
        yield Stores(registry, audit)
