"""Test helpers: configs for the demo identities, and service URLs."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql

from haltwire.demo.stack import TOKENS, connect, demo_config, running_gateway, running_upstream

__all__ = [
    "TOKENS",
    "config_dict",
    "connect",
    "drop_schema",
    "postgres_section",
    "postgres_url",
    "redis_url",
    "require_services",
    "running_gateway",
    "running_upstream",
    "service_missing",
]

#: Tests call the demo's config builder by this name.
config_dict = demo_config


def redis_url() -> str:
    return os.environ.get("HALTWIRE_REDIS_URL", "redis://127.0.0.1:6379/0")


def require_services() -> bool:
    """Under HALTWIRE_REQUIRE_SERVICES=1 (CI), a missing PostgreSQL or Redis fails the test."""
    return os.environ.get("HALTWIRE_REQUIRE_SERVICES") == "1"


def service_missing(what: str) -> None:
    if require_services():
        pytest.fail(f"{what} is required (HALTWIRE_REQUIRE_SERVICES=1) but cannot be reached")
    pytest.skip(f"{what} cannot be reached")


def postgres_url() -> str:
    return os.environ.get("HALTWIRE_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def drop_schema(schema: str) -> None:
    """Drop a test's PostgreSQL schema (nothing to do when the server is gone)."""
    try:
        with psycopg.connect(postgres_url(), autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    except psycopg.OperationalError:
        pass


@contextmanager
def postgres_section(prefix: str = "test_control") -> Iterator[dict[str, Any]]:
    """A control plane's ``[registry]`` section on a fresh PostgreSQL schema, dropped afterwards."""
    try:
        psycopg.connect(postgres_url(), connect_timeout=5).close()
    except psycopg.OperationalError:
        service_missing("PostgreSQL")
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    try:
        yield {"backend": "postgres", "url": postgres_url(), "schema": schema}
    finally:
        drop_schema(schema)
