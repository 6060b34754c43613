"""How the control plane's records are written as JSON: one function per record, used by every route."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from haltwire.control.reports import SECTIONS, RunReport
from haltwire.intents import Intent
from haltwire.stops import Change, StopRecord
from haltwire.store.credentials import CredentialRecord
from haltwire.store.runs import Checkpoint, RunRecord


def stop_json(stop: StopRecord) -> dict[str, Any]:
    return {**asdict(stop), "cleared": stop.cleared}


def change_json(change: Change) -> dict[str, Any]:
    return {"revision": change.revision, "kind": change.kind, "stop": stop_json(change.stop)}


def run_json(run: RunRecord) -> dict[str, Any]:
    return {**asdict(run), "tools": list(run.tools)}


def checkpoint_json(checkpoint: Checkpoint | None) -> dict[str, Any] | None:
    return None if checkpoint is None else asdict(checkpoint)


def intent_json(intent: Intent) -> dict[str, Any]:
    return asdict(intent)


def intents_json(intents: list[Intent]) -> dict[str, Any]:
    return {"intents": [intent_json(i) for i in intents]}


def credential_json(token: str, record: CredentialRecord) -> dict[str, Any]:
    """An issued credential: the token and its map entry, less the run (the caller named it)."""
    return {
        "token": token,
        "jti": record.jti,
        "audience": record.audience,
        "issued_at": record.issued_at,
        "expires_at": record.expires_at,
        "kid": record.kid,
    }


def report_json(report: RunReport) -> dict[str, Any]:
    out: dict[str, Any] = {"run": run_json(report.run)}
    for section in SECTIONS:
        out[section] = [intent_json(i) for i in getattr(report, section)]
    out["stops"] = [stop_json(s) for s in report.stops]
    out["timeline"] = [asdict(t) for t in report.timeline]
    return out
