"""The names haltwire reads and writes on MCP messages: ``_meta`` keys and the lease header.

Shared by the gateway, the executor and the runtime SDK, so each side spells them once.
"""

from __future__ import annotations

from typing import Final

#: Where a ``tools/call`` carries its lease token and the run it believes it is in
#: (``params._meta``), and the header for clients that can only set headers (lower case,
#: as ASGI gives it).
LEASE_META: Final = "io.haltwire/lease"
RUN_META: Final = "io.haltwire/run"
LEASE_HEADER: Final = "haltwire-lease"
#: The idempotency key, on the call (from the client) and on the result.
KEY_META: Final = "io.haltwire/idempotency_key"
#: Marks a result answered from the gateway's record instead of the upstream.
REPLAYED_META: Final = "io.haltwire/replayed"
#: A tool's label in its ``_meta`` on ``tools/list``.
LABEL_META: Final = "io.haltwire/label"
