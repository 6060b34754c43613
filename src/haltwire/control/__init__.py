"""The control plane: the out-of-band stop registry, its audit log, its watch stream, runs and leases,
the credential broker, intents and run reports.

Two layers: rules that know nothing of HTTP (``access``, ``stops``, ``runs``, ``credentials``,
``intents``, ``reports``, on the state in ``plane``), and the routes that parse, authorize, call
one rule and write its answer (``haltwire.control.routes``).
"""

from haltwire.control.access import ROLES
from haltwire.control.config import Caller, ControlConfig, load_control_config, parse_control_config
from haltwire.control.errors import Refused
from haltwire.control.leases import LeaseDesk
from haltwire.control.routes import create_app
from haltwire.control.routes.admin import AdminOnly, AgentsListener, EnforcementOnly
from haltwire.tokens import Grant

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
