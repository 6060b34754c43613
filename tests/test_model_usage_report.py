"""A run's model usage in its report (issue 14): the gateway reports the tokens and cost it
counted to the control plane, which sums them per model in ``GET /v1/runs/{id}/report``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from haltwire.control.usage import run_usage
from haltwire.demo.stack import CONTROL_TOKENS
from haltwire.gateway.outcomes import Unsent, _take
from haltwire.runtime import ControlClient, Lease
from haltwire.store.audit import AuditRecord
from models_harness import model_stack

MESSAGES: Any = [{"role": "user", "content": "hi"}]
pytestmark = pytest.mark.anyio


PRICES = {"*": {"input_per_mtok": 1.0, "output_per_mtok": 4.0}}


async def test_a_runs_model_tokens_and_cost_are_in_its_report(tmp_path: Path) -> None:
    async with (
        model_stack(tmp_path, runs=True, prices=PRICES) as s,
        ControlClient(s.control or "", CONTROL_TOKENS["ops-bot"]) as control,
        Lease.start(control, push=False) as lease,
    ):
        client = s.client(default_headers={"Haltwire-Lease": lease.token})
        await client.chat.completions.create(model="gpt-test", messages=MESSAGES)
        stream = await client.responses.create(model="scripted-s", input="hi", stream=True)
        async for _ in stream:
            pass
        await client.chat.completions.create(model="gpt-test", messages=MESSAGES)
        async with httpx2.AsyncClient(base_url=s.control or "", timeout=10) as http:
            with anyio.fail_after(15):
                while (usage := await _usage(http, s.operator, lease.run_id))["calls"] < 3:
                    await anyio.sleep(0.1)
    # The provider's n-th request answers usage n times its unit (chat 11/3, responses 13/5).
    gpt_in, gpt_out = 11 + 33, 3 + 9
    gpt = {"model": "gpt-test", "calls": 2, "input_tokens": gpt_in, "output_tokens": gpt_out}
    gpt["cost_micros"] = gpt_in * 1 + gpt_out * 4
    scripted = {"model": "scripted-s", "calls": 1, "input_tokens": 26, "output_tokens": 10, "cost_micros": 26 + 40}
    assert usage["models"] == [gpt, scripted]
    totals = (usage["calls"], usage["input_tokens"], usage["output_tokens"], usage["cost_micros"])
    assert totals == (3, gpt_in + 26, gpt_out + 10, gpt_in + gpt_out * 4 + 66)


async def _usage(http: httpx2.AsyncClient, headers: dict[str, str], run_id: str) -> dict[str, Any]:
    r = await http.get(f"/v1/runs/{run_id}/report", headers=headers)
    assert r.status_code == 200, r.text
    usage: dict[str, Any] = r.json()["usage"]
    return usage


def test_queued_usage_is_summed_per_model_and_run_before_it_is_sent() -> None:
    unsent: Unsent = {}
    for run, model, i in [("r1", "a", 1), ("r1", "a", 2), ("r1", "b", 4), ("r2", "a", 8)]:
        item = {"report_id": f"{run}{model}{i}", "model": model, "calls": 1}
        _take(unsent, "usage", run, {**item, "input_tokens": i, "output_tokens": 2 * i, "cost_micros": 3 * i})
    assert [(u["model"], u["calls"], u["input_tokens"], u["cost_micros"]) for u in unsent["usage", "r1"]] == [
        ("a", 2, 3, 9),
        ("b", 1, 4, 12),
    ]
    assert len(unsent["usage", "r2"]) == 1


@pytest.mark.parametrize("tampered", [{"calls": -1}, {"input_tokens": "7"}, {"model": None}])
def test_a_tampered_usage_record_is_left_out_of_the_sum(tampered: dict[str, Any]) -> None:
    detail = {
        "run_id": "r",
        "model": "m",
        "calls": 1,
        "input_tokens": 5,
        "output_tokens": 1,
        "cost_micros": 0,
    }

    def rec(seq: int, target: str, **over: Any) -> AuditRecord:
        return AuditRecord(
            seq, 0.0, "gw", "gateway", "model.usage", target, "ok", "", {**detail, **over}, "", ""
        )

    usage = run_usage([rec(1, "u1"), rec(2, "u1"), rec(3, "u2", **tampered)], "r")
    assert (usage.calls, usage.input_tokens) == (1, 5)  # the repeat of u1 and the tampered u2 left out
