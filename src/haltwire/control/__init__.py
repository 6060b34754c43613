"""The control plane: the out-of-band stop registry, its audit log, its watch stream, runs and leases,
the credential broker, intents and run reports.

Two layers: rules that know nothing of HTTP (``access``, ``stops``, ``runs``, ``credentials``,
``intents``, ``reports``, on the state in ``plane``), and the routes that parse, authorize, call
one rule and write its answer (``haltwire.control.routes``).

The names below are imported on first use: every ``haltwire`` command builds the operator
commands' parsers (``haltwire.control.operator``), and a gateway or an executor should not pay
for importing the control plane's routes to start.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from haltwire.control.access import ROLES
    from haltwire.control.config import Caller, ControlConfig, load_control_config, parse_control_config
    from haltwire.control.errors import Refused
    from haltwire.control.leases import LeaseDesk
    from haltwire.control.routes import create_app
    from haltwire.control.routes.admin import AdminOnly, AgentsListener, EnforcementOnly
    from haltwire.tokens import Grant

#: Each exported name and the module it comes from.
_EXPORTS = {
    "ROLES": "haltwire.control.access",
    "AdminOnly": "haltwire.control.routes.admin",
    "AgentsListener": "haltwire.control.routes.admin",
    "Caller": "haltwire.control.config",
    "ControlConfig": "haltwire.control.config",
    "EnforcementOnly": "haltwire.control.routes.admin",
    "Grant": "haltwire.tokens",
    "LeaseDesk": "haltwire.control.leases",
    "Refused": "haltwire.control.errors",
    "create_app": "haltwire.control.routes",
    "load_control_config": "haltwire.control.config",
    "parse_control_config": "haltwire.control.config",
}

__all__ = [
    "ROLES",
    "AdminOnly",
    "AgentsListener",
    "Caller",
    "ControlConfig",
    "EnforcementOnly",
    "Grant",
    "LeaseDesk",
    "Refused",
    "create_app",
    "load_control_config",
    "parse_control_config",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
