"""haltwire: stops AI agents that must stop.

The public API is re-exported here; see ``docs/architecture.md`` for how the parts fit.
"""

from __future__ import annotations

__version__ = "0.1.0"

from haltwire.config import ConfigError
from haltwire.gateway.ceilings import Ceilings, Ticket, ToolCeilings
from haltwire.gateway.config import GatewayConfig, load_config, parse_config
from haltwire.gateway.killswitch import SuspensionFile, write_suspensions
from haltwire.identity import Identity, TokenTable, token_sha256
from haltwire.refusal import REQUEST_CODES, TERMINAL_CODES, TRANSIENT_CODES, Refusal
from haltwire.scope import GLOBAL, Scope, ScopeError, ScopeIndex, call_scopes

__all__ = [
    "GLOBAL",
    "REQUEST_CODES",
    "TERMINAL_CODES",
    "TRANSIENT_CODES",
    "Ceilings",
    "ConfigError",
    "GatewayConfig",
    "Identity",
    "Refusal",
    "Scope",
    "ScopeError",
    "ScopeIndex",
    "SuspensionFile",
    "Ticket",
    "TokenTable",
    "ToolCeilings",
    "__version__",
    "call_scopes",
    "load_config",
    "parse_config",
    "token_sha256",
    "write_suspensions",
]
