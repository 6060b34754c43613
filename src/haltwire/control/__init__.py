"""The control plane: the out-of-band stop registry, its audit log, its watch stream, runs and leases."""

from haltwire.control.app import ROLES, create_app
from haltwire.control.config import Caller, ControlConfig, load_control_config, parse_control_config
from haltwire.control.leases import LeaseDesk, LeaseRefused
from haltwire.tokens import Grant

__all__ = [
    "ROLES",
    "Caller",
    "ControlConfig",
    "Grant",
    "LeaseDesk",
    "LeaseRefused",
    "create_app",
    "load_control_config",
    "parse_control_config",
]
