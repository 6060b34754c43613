"""The parts of the drill's stack that only some rungs need, and their configs: the canary
targets (``drill.targets``: the model provider, the verifying downstream, the network target),
``haltwire egress`` and ``haltwire executor``.

``needed(rungs)`` says which parts the rungs need (none for ``sdk``, ``gateway`` and
``fail_closed``, so a drill of those alone starts what it always did); ``unavailable(rung)``
says why a rung's part cannot run on this machine (the rung is then skipped, with the reason),
or None.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable
from typing import Any, Final

from haltwire.drill.targets import AUDIENCE, MODEL

#: Which parts each rung needs beyond the control plane, the canary upstream and the gateway.
PARTS: Final[dict[str, frozenset[str]]] = {
    "model": frozenset({"targets"}),
    "broker": frozenset({"targets"}),
    "egress": frozenset({"targets", "egress"}),
    "executor": frozenset({"executor"}),
}
#: The modules each part runs on (a rung whose part cannot import is skipped).
MODULES: Final = {"targets": "haltwire.drill.targets", "egress": "h11", "executor": "haltwire.executor"}
#: The gateway reads the canary provider's key from here (it is sent to the provider alone).
MODEL_KEY_ENV: Final = "HALTWIRE_DRILL_MODEL_KEY"
EGRESS_PROFILE: Final = "drill"


def needed(rungs: Iterable[str]) -> frozenset[str]:
    return frozenset().union(*(PARTS.get(r, frozenset()) for r in rungs))


def unavailable(rung: str) -> str | None:
    """Why ``rung`` cannot run on this machine, as a sentence naming it; None when it can."""
    if rung == "egress" and not sys.platform.startswith(("linux", "darwin")):
        return f"the egress rung is skipped: haltwire egress does not run on {sys.platform}"
    for part in sorted(PARTS.get(rung, frozenset())):
        if importlib.util.find_spec(MODULES[part]) is None:
            return (
                f"the {rung} rung is skipped: its {part} cannot run here ({MODULES[part]} is not installed)"
            )
    return None


def broker_section() -> dict[str, Any]:
    """The control plane's broker: a generated key (development), credentials for the downstream."""
    return {"generate": True, "audiences": [AUDIENCE], "ttl_s": 60.0}


def models_section(targets_url: str) -> list[dict[str, Any]]:
    return [
        {"name": "canary", "base_url": f"{targets_url}/v1", "api_key_env": MODEL_KEY_ENV, "models": [MODEL]}
    ]


def executor_section(token: str) -> dict[str, Any]:
    """Polling every 100 ms while nothing is pending (with work it claims the next at once): no
    faster, or its claims crowd the SQLite registry the canaries' registrations write to."""
    return {"token": token, "poll_s": 0.1, "retry_s": 0.1}


def egress_config(
    port: int,
    enforcement_url: str,
    token: str,
    lease_key: dict[str, str],
    staleness_s: float,
    connect_s: float,
    target_port: int,
    agent: str,
) -> dict[str, Any]:
    """The proxy: the canary agent may reach the canary targets' port on loopback, nothing else."""
    return {
        "egress": {
            "development": True,
            "host": "127.0.0.1",
            "port": port,
            "stale_check_s": 0.05,
            "default_profile": "none",
            "profiles": {EGRESS_PROFILE: [f"127.0.0.1:{target_port}"]},
            "agents": {agent: EGRESS_PROFILE},
        },
        "control": {
            "url": enforcement_url,
            "token": token,
            "staleness_s": staleness_s,
            "connect_timeout_s": connect_s,
        },
        "leases": {"keys": [lease_key]},
    }
