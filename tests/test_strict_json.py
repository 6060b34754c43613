"""NaN, Infinity, -Infinity and numbers too large for a float (1e400) are not JSON (RFC 8259), but
Python's ``json`` and pydantic's parser read them; Python's ``json`` also reads an unpaired
surrogate escape (``"\\ud800"``), which no UTF-8 encoder writes back. Every request body
haltwire parses is read by one strict parser (``haltwire.jsonwire``): at the gateway such a body
is a JSON-RPC parse error (400), decided before anything is counted, never a 500 or a traceback
(issue 12, point 7); at the control plane it is a 422.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx2
import pytest

from haltwire import jsonwire
from harness import TOKENS, connect, running_gateway, running_upstream
from intents_harness import intents_config, listed
from plane_harness import bearer, full_plane
from stops_harness import control_plane

pytestmark = pytest.mark.anyio

MODERN: Final = "2026-07-28"
LEGACY: Final = "2025-11-25"
ENVELOPE: Final = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
}
#: Tokens Python's json reads as floats that no JSON document holds.
NOT_FINITE: Final = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1.5e999"]
#: Strings Python's json reads that no UTF-8 encoder writes back: unpaired surrogates.
SURROGATES: Final = ['"\\ud800"', '"x\\udfffy"', '["\\ud83d"]']
#: Every value a body may not hold, as JSON text.
NOT_JSON: Final = [*NOT_FINITE, *SURROGATES]


@pytest.mark.parametrize("text", [f'{{"a": [1, {{"b": {t}}}]}}' for t in NOT_JSON] + NOT_JSON)
def test_the_parser_refuses_what_is_not_json(text: str) -> None:
    with pytest.raises(jsonwire.NotJson):
        jsonwire.loads(text)
    with pytest.raises(jsonwire.NotJson):
        jsonwire.loads(text.encode())


def test_the_parser_reads_everything_else_as_json_does() -> None:
    text = (
        '{"a": [1, -2.5, 1e308, -0.0, 12345678901234567890123, "NaN", "Infinity", true, null],'
        ' "b": "\\ud83d\\ude00 \\\\ud800 \u00ed\u00a0 \u00e9"}'
    )
    assert jsonwire.loads(text) == json.loads(text)
    assert jsonwire.loads(text.encode()) == json.loads(text)
    with pytest.raises(ValueError) as caught:
        jsonwire.loads("{not json")
    assert not isinstance(caught.value, jsonwire.NotJson)
    # A surrogate encoded raw (CESU-8), which json.loads decodes with surrogatepass.
    with pytest.raises(jsonwire.NotJson):
        jsonwire.loads(b'{"a": "\xed\xa0\x80"}')


#: Bodies whose reading must not depend on which parser reads them (orjson or Python's json).
BOTH_PARSERS: Final = [
    b'{"a": [1, -2.5, 1e308, -0.0, 2.5e-400, 1E2, "\\ud83d\\ude00", "\xc3\xa9"], "a": {"dup": true}}',
    b'[9223372036854775807, -9223372036854775808, 18446744073709551615, 123456789012345678901]',
    b'[-9223372036854775809]',  # 19 digits, one past 64 bits: orjson reads it as a float
    b'{"note": "a run of 19 digits 1234567890123456789 in a string", "n": 18446744073709551616}',
    b'18446744073709551616',  # a run at the very end
    b' {"deep": [[[[[[[[[[{}]]]]]]]]]]} ',
    b"\xef\xbb\xbf{}",  # a UTF-8 byte order mark, which json.loads takes from bytes
    "{}".encode("utf-16"),  # json.loads reads UTF-16 and UTF-32 bytes too
    b'{"a": 1,}',
    b'{"a": "\xff"}',
    *(t.encode() for t in NOT_JSON),
]


def _decodes(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _read_text(text: str) -> tuple[str, Any]:
    try:
        return "value", json.dumps(jsonwire.loads(text))  # compared as written: 1 and 1.0 differ
    except jsonwire.NotJson as exc:
        return "NotJson", str(exc)
    except ValueError as exc:
        return type(exc).__name__, str(exc)


def _read(data: bytes) -> tuple[str, Any]:
    try:
        return "value", jsonwire.loads(data)
    except jsonwire.NotJson as exc:
        return "NotJson", str(exc)
    except ValueError as exc:
        return type(exc).__name__, None


@pytest.mark.parametrize("data", BOTH_PARSERS)
def test_orjson_reads_a_body_as_python_s_json_does(data: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = _read(data)
    monkeypatch.setattr(jsonwire, "orjson", None)  # a platform without orjson's wheel
    slow = _read(data)
    assert fast == slow
    if fast[0] == "value":  # an integer past 64 bits stays an integer, exactly
        assert json.dumps(fast[1]) == json.dumps(json.loads(data))


#: Text whose reading must not depend on the parser either (an SSE answer's events are text).
BOTH_PARSERS_TEXT: Final = [
    *(b.decode("utf-8") for b in BOTH_PARSERS if _decodes(b)),
    "\ufeff{}",  # a byte order mark, which json.loads refuses in text (and takes from bytes)
    '"\ud800"',  # a lone surrogate in the text itself, not escaped
    '{"a": "\\ud83d\\ude00 \u00e9 \U0001f600"}',  # an escaped pair, then text outside ASCII and the BMP
]


@pytest.mark.parametrize("text", BOTH_PARSERS_TEXT)
def test_orjson_reads_text_as_python_s_json_does(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = _read_text(text)
    monkeypatch.setattr(jsonwire, "orjson", None)
    assert fast == _read_text(text)


def test_dumps_writes_compact_utf8_and_what_orjson_cannot_through_json() -> None:
    assert jsonwire.dumps({"a": [1, "é"], "b": None}) == '{"a":[1,"é"],"b":null}'.encode()
    big = {"n": 2**70, "x": [0.5]}
    assert jsonwire.loads(jsonwire.dumps(big)) == big
    assert jsonwire.sorted_dumps({"b": 1, "a": {"d": 2**70, "c": 1}}) == b'{"a":{"c":1,"d":1180591620717411303424},"b":1}'
    assert jsonwire.sorted_dumps({"b": 1, "a": "é"}) == '{"a":"é","b":1}'.encode()


@pytest.fixture
def logged() -> Iterator[list[logging.LogRecord]]:
    """Every record at WARNING and above, uvicorn's own included (they do not reach the root)."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(logging.WARNING)
    loggers = [logging.getLogger(), logging.getLogger("uvicorn.error"), logging.getLogger("uvicorn")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def call_body(tool: str, value: str, *, modern: bool) -> str:
    params = {"name": tool, "arguments": {"order_id": "A-1", "amount": 1}}
    if modern:
        params["_meta"] = ENVELOPE
    text = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params})
    return text.replace('"amount": 1', f'"amount": {value}')


async def post(url: str, body: str, *, modern: bool, tool: str = "lookup_order") -> httpx2.Response:
    headers = {
        "Authorization": f"Bearer {TOKENS['ops-bot']}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": MODERN if modern else LEGACY,
    }
    if modern:
        headers |= {"Mcp-Method": "tools/call", "Mcp-Name": tool}
    async with httpx2.AsyncClient(timeout=10) as http:
        return await http.post(url, content=body, headers=headers)


def parse_error(r: httpx2.Response) -> None:
    assert r.status_code == 400, r.text
    answer = r.json()
    assert answer["jsonrpc"] == "2.0" and answer["id"] is None
    assert answer["error"]["code"] == -32700 and "RFC 8259" in answer["error"]["message"]


async def test_non_finite_numbers_in_an_irreversible_calls_arguments_are_a_parse_error(
    tmp_path: Path, logged: list[logging.LogRecord]
) -> None:
    """The reported case: with intents on, NaN reached the intent's POST and was a 500. Now the
    body is refused before the pipeline: nothing counted, nothing recorded, nothing logged."""
    async with (
        control_plane(tmp_path / "control.db") as cp,
        running_upstream() as (demo, up),
        running_gateway({**intents_config(up, cp), "limits": {"budget": 1}}) as (_, url),
    ):
        for value in NOT_JSON:
            for modern in (True, False):
                parse_error(await post(url, call_body("lookup_order", value, modern=modern), modern=modern))
        assert await listed(cp) == []
        assert not [r for r in logged if r.levelno >= logging.ERROR or r.exc_info], [
            r.getMessage() for r in logged
        ]
        # Nothing was counted: the budget of 1 still admits one call.
        async with connect(url, TOKENS["ops-bot"]) as client:
            result = await client.call_tool("lookup_order", {"order_id": "A-1"})
            assert not result.is_error, result
            assert (result.structured_content or {})["intent"]["state"] == "pending"
            result = await client.call_tool("lookup_order", {"order_id": "A-2"})
            assert (result.structured_content or {})["error"]["code"] == "budget_exhausted"
        assert demo.served["lookup_order"] == 0


async def test_non_finite_numbers_never_reach_an_upstream(logged: list[logging.LogRecord]) -> None:
    """Without intents a NaN was forwarded to the upstream as it came (a body no JSON parser
    must accept); any request the gateway parses is refused the same way, not only tools/call."""
    async with running_upstream() as (demo, up), running_gateway(
        {**_standalone(up), "limits": {"budget": 1}}
    ) as (_, url):
        for value in NOT_JSON:
            for modern in (True, False):
                parse_error(await post(url, call_body("progress", value, modern=modern), modern=modern))
            listing = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"x": 1}})
            parse_error(await post(url, listing.replace('"x": 1', f'"x": {value}'), modern=False))
        assert sum(demo.served.values()) == 0
        assert not [r for r in logged if r.levelno >= logging.ERROR or r.exc_info]
        async with connect(url, TOKENS["ops-bot"]) as client:
            assert not (await client.call_tool("progress", {"steps": 1})).is_error


def _standalone(upstream: str) -> dict[str, Any]:
    from harness import config_dict

    return config_dict(upstream)


@pytest.mark.parametrize("value", NOT_JSON)
async def test_the_control_plane_refuses_non_finite_numbers_in_any_body(tmp_path: Path, value: str) -> None:
    async with full_plane({"backend": "sqlite", "path": str(tmp_path / "c.db")}) as (client, _):
        for path, body, role in (
            ("/v1/stops", '{"scope": "tool:x", "reason": "r", "expires_at": %s}', "operator"),
            ("/v1/runs", '{"run_id": "r-1", "tools": [%s]}', "agent"),
            ("/v1/leases/renew", '{"runs": ["r-1", %s]}', "agent"),
        ):
            r = await client.post(
                path, content=body % value, headers={**bearer(role), "Content-Type": "application/json"}
            )
            assert r.status_code == 422, (path, r.text)
            error = r.json()["error"]
            assert error["code"] == "invalid_request" and "RFC 8259" in error["message"], (path, r.text)
        assert (await client.get("/v1/stops", headers=bearer("operator"))).json() == {"stops": []}


@pytest.mark.parametrize("value", ["NaN", "-Infinity", "1e400", '"\\udc00"'])
async def test_an_upstream_answer_that_is_not_json_is_a_parse_error(value: str) -> None:
    """An upstream's answer holding NaN was relayed to the agent as it came (a body no JSON
    parser must accept): it is an answer the lean path cannot parse, like any other."""
    from mcp.shared.exceptions import MCPError

    from upstream_harness import JSON_HEADERS, SSE_HEADERS, caller_for, scripted

    def answer(method: str, headers: dict[str, str], body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        request_id = json.loads(body)["id"]
        text = f'{{"jsonrpc":"2.0","id":{request_id},"result":{{"content":[],"structuredContent":{{"x":{value}}}}}}}'
        framed = text.encode() if len(framings) % 2 else f"event: message\ndata: {text}\n\n".encode()
        return 200, JSON_HEADERS if len(framings) % 2 else SSE_HEADERS, framed

    framings: list[int] = []
    async with caller_for(scripted(answer)) as (caller, _):
        for framing in (0, 1):
            framings.append(framing)
            with pytest.raises(MCPError, match="RFC 8259") as raised:
                await caller.call_tool("t", None, None, None)
            assert raised.value.code == -32700
