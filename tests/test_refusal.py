"""Refusal shapes and words, and the SDK behaviour that makes haltwire return refusals instead of raising."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, get_type_hints

import mcp.types as types
import pytest
from mcp import Client
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError

import haltwire
from haltwire import refusal
from haltwire.demo.stack import connect
from haltwire.refusal import (
    DEMO_CODES,
    HTTP_STATUS,
    REQUEST_CODES,
    STOP_AND_TELL,
    TERMINAL_CODES,
    TRANSIENT_CODES,
    Refusal,
)
from haltwire.serve import serving

# The builders are found, not listed: every public function of haltwire.refusal that returns a
# Refusal. A new builder is covered the day it is written; only an argument no sample below fits
# (by name, then by type) needs a line here.
SAMPLES_BY_NAME: dict[str, Any] = {
    "who": "ops-bot",
    "budget": 20,
    "resets_at_s": 1_800_003_600,
    "tool": "refund",
    "run": "run-1",
    "steps": 50,
    "deadline_s": 30,
    "key": "refund-4711",
    "reason": "refund storm",
    "scope": "tenant:acme",
    "stop_id": "stp_1",
    "why": "bad signature",
    "name": "refunds-per-run",
    "cap": 2,
    "upstream": "demo",
    "limit": 1_048_576,
    "detail": "HTTP 422",
    "intent_id": "int_1",
    "max_chars": 256,
    # A defaulted argument with a sample is also tried with it.
    "retry_after_s": 2.5,
}
SAMPLES_BY_TYPE: dict[Any, Any] = {str: "sample", int: 3, float: 1.5}


def builders() -> dict[str, Callable[..., Refusal]]:
    found: dict[str, Callable[..., Refusal]] = {}
    for name, fn in inspect.getmembers(refusal, inspect.isfunction):
        public = not name.startswith("_") and fn.__module__.startswith(f"{refusal.__name__}.")
        if public and get_type_hints(fn).get("return") is Refusal:
            found[name] = fn
    return found


def _sample(builder: str, param: inspect.Parameter, hint: Any) -> Any:
    if param.name in SAMPLES_BY_NAME:
        return SAMPLES_BY_NAME[param.name]
    # ``str | None`` and the like: a sample of the type that is not None.
    options = [a for a in getattr(hint, "__args__", (hint,)) if a is not type(None)]
    for option in options:
        if option in SAMPLES_BY_TYPE:
            return SAMPLES_BY_TYPE[option]
    raise AssertionError(f"no sample for {builder}({param.name}: {hint}); add one to SAMPLES_BY_NAME")


def calls(name: str, fn: Callable[..., Refusal]) -> Iterator[tuple[str, Refusal]]:
    """Every way the test calls ``fn``: required arguments from the samples; each bool flag both
    ways; each defaulted argument with a sample both as defaulted and with the sample."""
    hints = get_type_hints(fn)
    required: dict[str, Any] = {}
    choices: list[list[tuple[str, Any] | None]] = []
    for p in inspect.signature(fn).parameters.values():
        hint = hints[p.name]
        if p.default is inspect.Parameter.empty:
            required[p.name] = _sample(name, p, hint)
        elif hint is bool:
            choices.append([(p.name, False), (p.name, True)])
        elif p.name in SAMPLES_BY_NAME or p.default is None:
            choices.append([None, (p.name, _sample(name, p, hint))])
    for combo in itertools.product(*choices):
        given = dict(c for c in combo if c is not None)
        shown = ", ".join(f"{k}={v!r}" for k, v in given.items())
        yield f"{name}({shown})", fn(**required, **given)


SAMPLES: dict[str, Refusal] = dict(
    itertools.chain.from_iterable(calls(name, fn) for name, fn in builders().items())
)
# Every code some builder gives, with every refusal that gives it.
BUILT: dict[str, list[Refusal]] = {}
for _r in SAMPLES.values():
    BUILT.setdefault(_r.code, []).append(_r)
KINDS: dict[str, frozenset[str]] = {
    "terminal": TERMINAL_CODES,
    "transient": TRANSIENT_CODES,
    "request": REQUEST_CODES,
    "demo": DEMO_CODES,
}
ALL_CODES: frozenset[str] = frozenset().union(*KINDS.values())
FORBIDDEN = re.compile(r"try again|retry|later", re.IGNORECASE)


def of_kind(codes: frozenset[str]) -> list[Any]:
    return [pytest.param(r, id=call) for call, r in SAMPLES.items() if r.code in codes]


def test_the_builders_are_found() -> None:
    # Guards the finder itself: a change to how builders are recognised must not find none.
    assert {"budget_exhausted", "run_steps_exhausted", "deadline_exceeded", "please_try_again"} <= set(
        builders()
    )
    assert (
        "deadline_exceeded(irreversible=True)" in SAMPLES
        and "deadline_exceeded(irreversible=False)" in SAMPLES
    )


def test_every_code_has_a_builder() -> None:
    assert set(BUILT) == ALL_CODES, "a code no builder gives, or a builder's code of no kind"
    for a, b in itertools.combinations(KINDS, 2):
        assert KINDS[a].isdisjoint(KINDS[b]), f"codes both {a} and {b}: {KINDS[a] & KINDS[b]}"
    assert set(HTTP_STATUS) == ALL_CODES
    assert {r.code: r.http_status for r in SAMPLES.values()} == {c: HTTP_STATUS[c] for c in ALL_CODES}


def test_the_package_exports_the_kinds_a_client_acts_on() -> None:
    assert (haltwire.TERMINAL_CODES, haltwire.TRANSIENT_CODES, haltwire.REQUEST_CODES) == (
        TERMINAL_CODES,
        TRANSIENT_CODES,
        REQUEST_CODES,
    )


@pytest.mark.parametrize("r", of_kind(TERMINAL_CODES))
def test_terminal_refusals_tell_the_agent_to_stop_and_never_invite_a_retry(r: Refusal) -> None:
    assert r.retryable is False
    assert r.retry_after_s is None
    assert not FORBIDDEN.search(r.message), r.message
    assert "stop calling tools" in r.message and "the task is incomplete" in r.message
    assert r.message.endswith(STOP_AND_TELL)
    assert r.message.count(".") == 1 and r.message.endswith("."), "one sentence"


@pytest.mark.parametrize("r", of_kind(TRANSIENT_CODES))
def test_transient_refusals_say_how_long_to_wait(r: Refusal) -> None:
    assert r.retryable is True
    assert r.retry_after_s is not None and r.retry_after_s > 0
    assert r.resets_at is None
    assert f"wait {r.retry_after_s:g} s" in r.message, r.message
    words = r.message.replace(f"{r.retry_after_s:g}", "N")
    assert words.count(".") == 1 and words.endswith("."), "one sentence"


@pytest.mark.parametrize("r", of_kind(REQUEST_CODES))
def test_request_refusals_say_what_is_wrong_without_a_stop_or_a_retry(r: Refusal) -> None:
    """Nothing was stopped (no STOP_AND_TELL) and the same call gets the same answer (no retry)."""
    assert r.retryable is False
    assert r.retry_after_s is None and r.resets_at is None
    assert not FORBIDDEN.search(r.message), r.message
    assert "stop calling tools" not in r.message and "task is incomplete" not in r.message
    assert r.message.count(".") == 1 and r.message.endswith("."), "one sentence"


@pytest.mark.parametrize("r", of_kind(DEMO_CODES))
def test_the_demo_refusal_is_the_failure_mode_it_shows(r: Refusal) -> None:
    """``haltwire demo loop`` shows what "please try again" does to an agent; it must keep saying it."""
    assert r.retryable is True
    assert FORBIDDEN.search(r.message), r.message
    assert "stop calling tools" not in r.message


@pytest.mark.parametrize("r", [pytest.param(r, id=call) for call, r in SAMPLES.items()])
def test_a_recorded_refusal_replays_as_it_was(r: Refusal) -> None:
    assert Refusal.from_error(r.error()) == dataclasses.replace(r, meta=())


#: The package, and the refusal package inside it (the one place that builds refusals).
REFUSAL = Path(refusal.__file__).parent
SRC = REFUSAL.parent


def _refusals_built_in(path: Path) -> Iterator[int]:
    """``Refusal(...)`` (under any name it is imported as) and ``replace(r, code=/message=/
    retryable=...)``: the ways a module could word a refusal itself."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = {"Refusal"} | {
        a.asname
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module is not None and node.module.startswith("haltwire.refusal")
        for a in node.names
        if a.name == "Refusal" and a.asname
    }
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        words = {k.arg for k in node.keywords} & {"code", "message", "retryable"}
        if called in names or (called == "replace" and words):
            yield node.lineno


def test_no_module_but_refusal_py_builds_a_refusal() -> None:
    modules = sorted(SRC.rglob("*.py"))
    assert len(modules) > 50 and SRC / "gateway" / "intents.py" in modules
    found = [
        f"{m.relative_to(SRC)}:{line}"
        for m in modules
        if REFUSAL not in m.parents
        for line in _refusals_built_in(m)
    ]
    assert found == [], "build refusals with a builder in haltwire/refusal/"


def test_the_finder_sees_a_refusal_built_elsewhere(tmp_path: Path) -> None:
    module = tmp_path / "rogue.py"
    module.write_text(
        "import dataclasses\n"
        "from haltwire.refusal import Refusal as R\n"
        "def a(): return R('x', 'Please try again later.', retryable=True)\n"
        "def b(r): return dataclasses.replace(r, message='Please try again later.')\n"
    )
    assert sorted(_refusals_built_in(module)) == [3, 4]


def test_the_tool_result_shape_matches_the_design() -> None:
    r = refusal.budget_exhausted("ops-bot", 20, 1_800_003_600)
    result = r.tool_result()
    assert result["isError"] is True
    assert result["content"] == [{"type": "text", "text": r.message}]
    assert result["structuredContent"] == {
        "error": {
            "code": "budget_exhausted",
            "message": r.message,
            "retryable": False,
            "resets_at": "2027-01-15T09:00:00Z",
        }
    }
    assert "2027-01-15T09:00:00Z" in r.message
    # It validates as an MCP CallToolResult.
    parsed = types.CallToolResult.model_validate(result)
    assert parsed.is_error and parsed.structured_content == result["structuredContent"]


def test_stopped_carries_scope_stop_id_and_reason() -> None:
    error = refusal.stopped("tool:refund", "stp_9", "refund storm").error()
    assert (error["scope"], error["stop_id"], error["reason"]) == ("tool:refund", "stp_9", "refund storm")


def test_http_statuses_at_the_edge() -> None:
    assert refusal.unauthenticated("x").http_status == 401
    assert refusal.agent_suspended("x").http_status == 403
    assert refusal.budget_exhausted("x", 1, 0).http_status == 429
    assert refusal.too_many_in_flight("x", 1).http_status == 429
    assert refusal.counters_unavailable().http_status == 503
    assert refusal.payload_too_large(10).http_status == 413


# The SDK behaviour haltwire is built around: a raised error loses structuredContent.


@pytest.mark.anyio
async def test_a_raised_error_reaches_the_client_as_an_exception_not_a_tool_result() -> None:
    """Over real HTTP: a raised MCPError makes the client raise (no result for the model to read),
    and any other exception loses its words entirely."""
    data = refusal.budget_exhausted("ops-bot", 20, 1_800_003_600).error()

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name == "protocol_error":
            raise MCPError(code=-32000, message=data["message"], data={"error": data})
        raise RuntimeError(data["message"])

    server = Server("raises", on_call_tool=call_tool)
    app = server.streamable_http_app(
        stateless_http=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    async with serving(app) as url, connect(f"{url}/mcp", None) as client:
        with pytest.raises(MCPError) as protocol_error:
            await client.call_tool("protocol_error", {})
        with pytest.raises(MCPError) as crash:
            await client.call_tool("crash", {})
    assert protocol_error.value.code == -32000  # an exception in the caller, never a CallToolResult
    assert crash.value.message == "Internal server error"
    assert "ops-bot" not in crash.value.message and crash.value.error.data is None


@pytest.mark.anyio
async def test_a_tool_error_in_the_high_level_server_becomes_bare_text() -> None:
    app = MCPServer("raises")

    @app.tool()
    def refund() -> str:
        raise ToolError("budget_exhausted: stop")

    async with Client(app) as client:
        result = await client.call_tool("refund", {})
    assert result.is_error is True
    assert result.structured_content is None, "the refusal's data did not survive the raise"
    assert "budget_exhausted" in result.content[0].text  # type: ignore[union-attr]
