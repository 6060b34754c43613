"""The control plane: the out-of-band stop registry, its audit log and its watch stream."""

from haltwire.control.app import ROLES, create_app
from haltwire.control.config import Caller, ControlConfig, load_control_config, parse_control_config

__all__ = ["ROLES", "Caller", "ControlConfig", "create_app", "load_control_config", "parse_control_config"]
