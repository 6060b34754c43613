"""Test helpers: configs for the demo identities, and service URLs."""

from __future__ import annotations

import os
from typing import Any

import pytest

from haltwire.demo.stack import connect, running_gateway, running_upstream

TOKENS = {"ops-bot": "tok-ops", "billing-bot": "tok-billing", "edge-bot": "tok-edge"}

__all__ = [
    "TOKENS",
    "config_dict",
    "connect",
    "redis_url",
    "require_services",
    "running_gateway",
    "running_upstream",
]


def config_dict(upstream_url: str, **sections: Any) -> dict[str, Any]:
    """A development config with ops-bot and billing-bot in front of ``upstream_url``.

    Each keyword replaces a top-level section, or is merged into it when both are tables.
    """
    data: dict[str, Any] = {
        "gateway": {"development": True},
        "identities": [
            {"agent": "ops-bot", "tenant": "acme", "version": "1.0", "token": TOKENS["ops-bot"]},
            {"agent": "billing-bot", "tenant": "acme", "version": "2.0", "token": TOKENS["billing-bot"]},
        ],
        "upstreams": [
            {"name": "demo", "url": f"{upstream_url}/mcp", "headers": {"Authorization": "Bearer shared-key"}}
        ],
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return data


def redis_url() -> str:
    return os.environ.get("HALTWIRE_REDIS_URL", "redis://127.0.0.1:6379/0")


def require_services() -> bool:
    """Under HALTWIRE_REQUIRE_SERVICES=1 (CI), a missing PostgreSQL or Redis fails the test."""
    return os.environ.get("HALTWIRE_REQUIRE_SERVICES") == "1"


def service_missing(what: str) -> None:
    if require_services():
        pytest.fail(f"{what} is required (HALTWIRE_REQUIRE_SERVICES=1) but cannot be reached")
    pytest.skip(f"{what} cannot be reached")
