"""The runtime SDK, inside the agent process: a run's lease, the guard, the MCP helper."""

from haltwire.meta import LEASE_META, RUN_META
from haltwire.runtime.client import ControlClient, ControlRefused, ControlUnreachable, Registration
from haltwire.runtime.guard import Guard
from haltwire.runtime.lease import Lease, StopNotice, StopRequested
from haltwire.runtime.mcp import LeasedTools
from haltwire.runtime.pool import LeasePool
from haltwire.tokens import Grant

__all__ = [
    "LEASE_META",
    "RUN_META",
    "ControlClient",
    "ControlRefused",
    "ControlUnreachable",
    "Grant",
    "Guard",
    "Lease",
    "LeasePool",
    "LeasedTools",
    "Registration",
    "StopNotice",
    "StopRequested",
]
