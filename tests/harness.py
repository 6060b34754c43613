"""Test helpers: configs for the demo identities, and service URLs."""

from __future__ import annotations

import os

import pytest

from haltwire.demo.stack import TOKENS, connect, demo_config, running_gateway, running_upstream

__all__ = [
    "TOKENS",
    "config_dict",
    "connect",
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
