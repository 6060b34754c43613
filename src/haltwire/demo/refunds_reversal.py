"""The reversal script of a ``haltwire demo refunds`` run: bash that undoes its committed refunds."""

from __future__ import annotations

import shlex

from haltwire.demo.refunds_run import RunResult


def reversal_script(r: RunResult) -> str:
    """A bash script reversing the run's committed refunds, each once (its own idempotency key)."""
    lines = [
        "#!/usr/bin/env bash",
        f"# Reverse the {len(r.committed())} refunds committed by run {r.run_id} (haltwire report {r.run_id}).",
        "# Each reversal carries its own idempotency key, so running this twice reverses nothing twice.",
        "# (The demo's shop has no reversal endpoint: point ORDERS_API at the real refunds API.)",
        "set -euo pipefail",
        'ORDERS_API="${ORDERS_API:?set ORDERS_API to the refunds API}"',
        "reverse() {  # refund_id order_id amount_cents original_key",
        '  curl -fsS -X POST "$ORDERS_API/refunds/$1/reverse" -H "Idempotency-Key: reverse-$4" \\',
        '    -H "Content-Type: application/json" -d "{\\"order_id\\": \\"$2\\", \\"amount_cents\\": $3}"',
        "}",
    ]
    for c in r.committed():
        args = [str(c["refund_id"]), str(c["order_id"]), str(c["amount_cents"]), str(c["idempotency_key"])]
        lines.append("reverse " + " ".join(shlex.quote(a) for a in args))
    return "\n".join(lines)
