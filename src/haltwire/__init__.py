"""haltwire: stops AI agents that must stop.

What every part shares is re-exported here: identities, scopes, stop records and refusals.
Each process has its own package: ``haltwire.gateway`` (the MCP gateway), ``haltwire.control``
(the control plane), ``haltwire.executor``, and ``haltwire.runtime`` (the SDK inside an agent
process); ``docs/architecture.md`` shows how they fit and who may import whom.
"""

from __future__ import annotations

__version__ = "0.1.0"

from haltwire.config import ConfigError
from haltwire.identity import Identity, TokenTable, token_sha256
from haltwire.refusal import REQUEST_CODES, TERMINAL_CODES, TRANSIENT_CODES, Refusal
from haltwire.scope import GLOBAL, Scope, ScopeError, ScopeIndex, call_scopes
from haltwire.stops import StopRecord, StopSet

__all__ = [
    "GLOBAL",
    "REQUEST_CODES",
    "TERMINAL_CODES",
    "TRANSIENT_CODES",
    "ConfigError",
    "Identity",
    "Refusal",
    "Scope",
    "ScopeError",
    "ScopeIndex",
    "StopRecord",
    "StopSet",
    "TokenTable",
    "__version__",
    "call_scopes",
    "token_sha256",
]
