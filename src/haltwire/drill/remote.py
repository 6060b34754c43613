"""Drilling a running stack: ``haltwire drill --control URL --agents URL --gateway URL --token-file FILE``.

The drill starts only the canary upstream, locally (``--canary-host``, ``--canary-port``), or
uses one kept running (``--canary-url``: a gateway's readiness counts every upstream, so a
production gateway's route is better served all the time); the stack's gateway must route a
tool ``canary_write`` to it. The token file (TOML) holds the drill's
identities' tokens: ``operator`` (a drill identity of role ``operator`` or ``tripwire`` on the
admin listener), ``runtime`` (the canary runtime's, on the agents' listener) and ``agent`` (its
bearer token at the gateway; default: ``runtime``'s).

``check`` asks, in this order, and stops at the first thing missing with one sentence naming it:

1. the admin listener knows the operator token, of role ``operator`` or ``tripwire``, marked
   ``drill = true`` (else its stops would be taken for incidents);
2. the agents' listener knows the runtime token: role ``agent``, marked ``drill = true``, agent
   ``canary`` version ``1.0`` in tenant ``drill`` (the names the rungs stop);
3. the control plane registers a run of agent class ``canary`` (its lease period is the target's
   floor: the control plane does not serve ``time_to_stop_s``, so ``--target-s`` gives it);
4. the gateway lists ``canary_write`` to the drill's agent, and a call of it with the check run's
   lease lands in the canary's record (the gateway reaches the canary);

then ends the check run. Never drilled here: the ``global`` scope (it would stop every agent of
the stack) and ``fail_closed`` (the drill cannot make someone else's control plane unreachable).
"""

from __future__ import annotations

import tempfile
import tomllib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, cast

import anyio
import httpx2
from mcp.types import RequestParamsMeta

from haltwire.demo.processes import Processes
from haltwire.drill.agents import control_client, mcp_client
from haltwire.drill.canary import TOOL
from haltwire.drill.stack import AGENT, AGENT_CLASS, TENANT, VERSION
from haltwire.errors import unwrapped
from haltwire.meta import LEASE_META, RUN_META
from haltwire.runtime import ControlRefused, ControlUnreachable

#: The scope kinds drilled on a running stack: never ``global``.
KINDS: Final = ("run", "tenant", "agent", "version", "tool")
#: Why a running stack's ``fail_closed`` rung is skipped.
NO_FAIL_CLOSED: Final = (
    "the drill cannot make a control plane it did not start unreachable; drill fail_closed with --embedded"
)
#: Why a running stack's ladder rungs (model, broker, egress, executor) are skipped.
NO_PARTS: Final = "it needs parts the drill starts itself (its targets, egress proxy, executor); drill it with --embedded"
#: Where the canary listens by default: the gateway's route to it names this port.
CANARY_PORT: Final = 8790
#: How long the gateway has to reach the canary (it reconnects to a down upstream by itself,
#: waiting at most 10 s between tries: ``upstreams.RECONNECT_MAX_S``).
GATEWAY_WAIT_S: Final = 15.0
TOKEN_KEYS: Final = ("operator", "runtime", "agent")


class TargetMissing(Exception):
    """The running stack lacks what a drill needs; the message is one sentence saying what."""


def read_tokens(path: Path) -> dict[str, str]:
    """The token file's tokens; ``ValueError`` with a sentence when it is not usable."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"--token-file {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"--token-file {path} is not TOML: {exc}") from None
    unknown = sorted(set(data) - set(TOKEN_KEYS))
    if unknown:
        raise ValueError(f"--token-file {path}: unknown key {', '.join(unknown)}; the keys are {', '.join(TOKEN_KEYS)}")
    data.setdefault("agent", data.get("runtime"))
    for key in TOKEN_KEYS:
        if not isinstance(data.get(key), str) or not data[key]:
            raise ValueError(f"--token-file {path}: {key} must be a token (a non-empty string)")
    return {k: str(data[k]) for k in TOKEN_KEYS}


class RemoteStack:
    """A running stack's URLs and the drill's tokens; the canary upstream is the drill's own."""

    def __init__(
        self, admin_url: str, agents_url: str, gateway_url: str, tokens: dict[str, str], canary_url: str
    ) -> None:
        self.admin_url = admin_url.rstrip("/")
        self.control_url = agents_url.rstrip("/")
        self.gateway_url = gateway_url.rstrip("/")
        self.canary_url = canary_url.rstrip("/")
        self.tokens = tokens
        #: None of the ladder's parts: its rungs are skipped (``NO_PARTS``).
        self.targets_url = ""
        self.parts: frozenset[str] = frozenset()

    @property
    def mcp_url(self) -> str:
        return f"{self.gateway_url}/mcp"

    def pause_control(self) -> None:
        raise TargetMissing(NO_FAIL_CLOSED)

    def resume_control(self) -> None:
        pass


@contextmanager
def running_remote(
    admin_url: str, agents_url: str, gateway_url: str, tokens: dict[str, str], canary: tuple[str, int] | str
) -> Iterator[RemoteStack]:
    """The running stack, with the canary upstream started here (and ended however the block
    ends) on ``canary`` (host and port), or one already running at ``canary`` (a URL)."""
    if isinstance(canary, str):
        yield RemoteStack(admin_url, agents_url, gateway_url, tokens, canary)
        return
    with tempfile.TemporaryDirectory(prefix="haltwire-drill-") as tmp:
        processes = Processes(Path(tmp))
        stack = RemoteStack(admin_url, agents_url, gateway_url, tokens, f"http://{canary[0]}:{canary[1]}")
        try:
            up = processes.spawn(
                "canary upstream", "-m", "haltwire.drill.canary", "--host", canary[0], "--port", str(canary[1])
            )
            up.wait_http(f"{stack.canary_url}/record")
            yield stack
        finally:
            processes.close()


async def _whoami(url: str, token: str, what: str) -> dict[str, Any]:
    try:
        async with httpx2.AsyncClient(timeout=5.0) as http:
            r = await http.get(f"{url}/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    except httpx2.HTTPError as exc:
        raise TargetMissing(f"cannot reach the control plane's {what} at {url}: {exc or type(exc).__name__}") from None
    if r.status_code == 401:
        raise TargetMissing(f"the control plane's {what} at {url} does not know the token file's token for it")
    if r.status_code != 200:
        try:
            said = str(r.json()["error"]["message"])
        except (ValueError, KeyError, TypeError):
            said = r.text[:200]
        raise TargetMissing(f"the control plane's {what} at {url} refuses the token file's token for it: {said}")
    return cast(dict[str, Any], r.json())


def _not_drill(who: dict[str, Any]) -> TargetMissing:
    return TargetMissing(
        f"identity {who.get('name')} is not a drill identity: give it drill = true in the control plane's "
        "[[identities]] (a drill's stops and runs must be marked as drill data)"
    )


async def check_identities(stack: RemoteStack) -> None:
    """Checks 1 and 2 of the module's docstring."""
    who = await _whoami(stack.admin_url, stack.tokens["operator"], "admin listener")
    if who.get("role") not in ("operator", "tripwire"):
        raise TargetMissing(f"identity {who.get('name')} has role {who.get('role')}; a drill stops as operator or tripwire")
    if who.get("drill") is not True:
        raise _not_drill(who)
    runtime = await _whoami(stack.control_url, stack.tokens["runtime"], "agents' listener")
    if runtime.get("role") != "agent":
        raise TargetMissing(f"the runtime token is identity {runtime.get('name')}, of role {runtime.get('role')}, not agent")
    if runtime.get("drill") is not True:
        raise _not_drill(runtime)
    said = (runtime.get("agent"), runtime.get("version"), runtime.get("tenant"))
    if said != (AGENT, VERSION, TENANT):
        raise TargetMissing(
            f"identity {runtime.get('name')} is agent {said[0]} version {said[1]} in tenant {said[2]}; the drill's "
            f"canary runtime must be agent {AGENT} version {VERSION} in tenant {TENANT}"
        )


async def check(stack: RemoteStack) -> tuple[float, str]:
    """What a drill needs of the stack (the module's docstring): the class's ``ttl_s`` and the
    check run's id (ended; its one side effect is in the canary's record)."""
    await check_identities(stack)
    async with control_client(stack.control_url, stack.tokens["runtime"]) as control:
        try:
            registration = await control.register_run(agent_class=AGENT_CLASS, tools=[TOOL])
        except (ControlRefused, ControlUnreachable) as exc:
            raise TargetMissing(
                f"the control plane did not register a run of agent class {AGENT_CLASS} ({exc}); "
                f"it needs [agent_classes.{AGENT_CLASS}] and [leases]"
            ) from None
        grant = registration.grant
        try:
            await _check_gateway(stack, grant.run_id, grant.token)
        finally:
            await control.end_run(grant.run_id)
    return grant.ttl_s, grant.run_id


async def _check_gateway(stack: RemoteStack, run_id: str, token: str) -> None:
    """Check 4, retried for ``GATEWAY_WAIT_S``: a gateway reconnects to an upstream that was down
    (the canary, between drills) in the background."""
    missing = TargetMissing(f"the gateway at {stack.mcp_url} did not answer within {GATEWAY_WAIT_S:g} s")
    with anyio.move_on_after(GATEWAY_WAIT_S):
        while True:
            try:
                return await _check_gateway_once(stack, run_id, token)
            except TargetMissing as exc:
                missing = exc
            await anyio.sleep(0.25)
    raise missing


async def _check_gateway_once(stack: RemoteStack, run_id: str, token: str) -> None:
    """The gateway serves ``canary_write`` to the drill's agent, and it reaches the canary."""
    route = f"route a tool {TOOL} to the drill's canary at {stack.canary_url}/mcp"
    await check_agent_token(stack)
    try:
        with unwrapped():
            async with mcp_client(stack.mcp_url, stack.tokens["agent"]) as client:
                tools = {t.name for t in (await client.list_tools()).tools}
                if TOOL not in tools:
                    raise TargetMissing(f"the gateway at {stack.gateway_url} lists no tool {TOOL} to the drill's agent: {route}")
                meta = cast(RequestParamsMeta, {LEASE_META: token, RUN_META: run_id})
                result = await client.call_tool(TOOL, {"run": run_id, "what": "check"}, meta=meta)
    except TargetMissing:
        raise
    except Exception as exc:  # an MCP session that cannot even start: the gateway is not there
        raise TargetMissing(f"cannot call the gateway at {stack.mcp_url} as the drill's agent: {exc!r}") from None
    async with httpx2.AsyncClient(timeout=5.0) as http:
        effects = (await http.get(f"{stack.canary_url}/record", params={"run": run_id})).json()["effects"]
    if result.is_error or not effects:
        error = (result.structured_content or {}).get("error", {})
        code = error.get("code", "no side effect recorded") if isinstance(error, dict) else "an error"
        raise TargetMissing(f"the gateway's {TOOL} did not reach the drill's canary ({code}): {route}")


async def check_agent_token(stack: RemoteStack) -> None:
    """The gateway knows the drill's agent (its edge answers 401 to any other token, first)."""
    ping = {"jsonrpc": "2.0", "id": 0, "method": "ping"}
    try:
        async with httpx2.AsyncClient(timeout=5.0) as http:
            r = await http.post(stack.mcp_url, json=ping, headers={"Authorization": f"Bearer {stack.tokens['agent']}"})
    except httpx2.HTTPError as exc:
        raise TargetMissing(f"cannot reach the gateway at {stack.mcp_url}: {exc or type(exc).__name__}") from None
    if r.status_code == 401:
        raise TargetMissing(
            f"the gateway at {stack.gateway_url} does not know the token file's agent token: give the drill's "
            f"agent {AGENT} (tenant {TENANT}, version {VERSION}) an identity there"
        )


async def unmarked(operator: httpx2.AsyncClient, run_ids: Sequence[str], stops: Sequence[tuple[str, str]]) -> int | None:
    """The audit records about the drill's runs and stops (``stops``: id and scope) not marked as
    drill data; None when the drill's identity may not read the audit log (a tripwire)."""
    records: dict[int, dict[str, Any]] = {}
    ids = {stop_id for stop_id, _ in stops}
    for target in [*run_ids, *ids, *sorted({scope for _, scope in stops})]:
        r = await operator.get("/v1/audit", params={"target": target})
        if r.status_code == 403:
            return None
        r.raise_for_status()
        for record in r.json()["records"]:
            detail = record.get("detail") or {}
            if record["target"] == target and (target in run_ids or target in ids or detail.get("stop_id") in ids):
                records[record["seq"]] = record
    return sum((r.get("detail") or {}).get("drill") is not True for r in records.values())
