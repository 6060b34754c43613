"""How much the control plane accepts, in one place: request bodies, and each field in them.

A value past its limit is refused 422 ``invalid_request`` naming the field and the limit, never
echoing the value: the refusal is answered, and a known caller's refused write is audited in a
log that is never pruned. The body models of ``haltwire.control.routes`` declare these limits
(so the OpenAPI document shows them); ``Scope.parse`` and ``checked_reason`` hold the rules to
the same numbers for callers that are not requests.
"""

from __future__ import annotations

import unicodedata
from typing import Final

#: ``[control] max_body_bytes``: any request's body. A checkpoint is a run's resumable state
#: (not its transcript), a stop a sentence; 1 MiB is the gateway's own default for a tool call.
MAX_BODY_BYTES: Final = 1 << 20
#: ``[control] max_intent_body_bytes``: recording an intent (a tool call's arguments, as large as
#: the gateway took them, plus their envelope) and committing one (the tool's result, which
#: nothing before bounds).
MAX_INTENT_BODY_BYTES: Final = 4 << 20
#: The smallest body limit a config may set: room for any body of bounded fields.
MIN_BODY_BYTES: Final = 4096

#: Run, stop and intent ids: ours are ``run_``/``stp_``/``int_`` and 16 hex digits; a run's may
#: be chosen by its agent (a URL path segment, a scope's value).
MAX_ID_CHARS: Final = 128
ID_PATTERN: Final = rf"^[A-Za-z0-9_.:-]{{1,{MAX_ID_CHARS}}}$"
#: Agent ids, tenants, versions, tool names, agent classes, audiences: printable, one line.
MAX_NAME_CHARS: Final = 256
#: An idempotency key (the gateway takes up to 255 characters from a client).
MAX_KEY_CHARS: Final = 256
#: A run's declared tools, runs renewed in one request, a page of a list.
MAX_ITEMS: Final = 1000
#: A scope's text (a version scope names an agent and its version).
MAX_SCOPE_CHARS: Final = 512
#: A stop's or clear's reason, an intent's rejection or failure: a sentence for the run report.
MAX_REASON_CHARS: Final = 2000
#: Calls a gateway reports in one request (``POST /v1/runs/{id}/calls``; it sends up to 100).
MAX_CALLS_PER_REPORT: Final = 100
#: The latest time a request may name, in Unix seconds (the year 2286): past it, not a time.
MAX_TIME_S: Final = 1e10

#: No control character (``has_control_characters``), as a JSON-Schema pattern for the document.
PRINTABLE_PATTERN: Final = r"^[^\u0000-\u001f\u007f-\u009f]*$"
#: The same, but newline and tab (reasons).
TEXT_PATTERN: Final = r"^[^\u0000-\u0008\u000b-\u001f\u007f-\u009f]*$"


def has_control_characters(text: str, allowed: str = "") -> bool:
    """Whether ``text`` holds a control character (C0 with NUL, DEL, C1), other than ``allowed``."""
    return any(unicodedata.category(c) == "Cc" and c not in allowed for c in text)


def shown(text: str, most: int = 32) -> str:
    """A caller's text as a refusal may quote it (a key's name, say): its start, control
    characters escaped (PostgreSQL refuses NUL in any text, the audit log's too)."""
    start = "".join(f"\\x{ord(c):02x}" if has_control_characters(c) else c for c in text[:most])
    return start if len(text) <= most else f"{start}... ({len(text)} characters)"


def fitted(text: str, most: int = MAX_REASON_CHARS) -> str:
    """``text`` as a reason field takes it, for text nobody chose (a tool's error message): other
    control characters than newline and tab become spaces, and past ``most`` it is cut."""
    kept = "".join(" " if has_control_characters(c, "\n\t") else c for c in text[:most]).strip()
    if len(text) > most:
        kept = kept[: most - 3] + "..."
    return kept or "(no message)"
