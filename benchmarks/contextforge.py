"""IBM ContextForge (``mcp-contextforge-gateway``) as one more proxy in ``benchmarks/gateway.py``.

ContextForge needs Python 3.12 and pins its own dependencies, so it lives in a venv of its own,
outside the project's (``.venv-contextforge`` in the repository root unless told otherwise)::

    python3.12 -m venv .venv-contextforge
    .venv-contextforge/bin/pip install "mcp-contextforge-gateway[plugins]==1.1.0"

(the ``plugins`` extra brings ``cpex-rate-limiter``, its per-user rate limiter).

``start`` runs it as its documentation does, in one process: ``VENV/bin/mcpgateway --host
127.0.0.1 --port PORT`` (uvicorn, one worker, ``mcpgateway.main:app``) in ``workdir``, with:

- a fresh SQLite database ``workdir/mcp.db`` (``DATABASE_URL``; it runs its migrations and
  creates the platform admin on start-up), ``TMPDIR=workdir`` for its lock files, and random
  JWT, encryption and password secrets (it refuses weak ones);
- authentication on (``AUTH_REQUIRED``, its default), the admin UI and admin API off (their
  defaults), logs at ``ERROR`` (its default) into ``workdir/contextforge.log``;
- its plugin framework on (``PLUGINS_ENABLED``) with ``workdir/plugins.yaml``: one plugin,
  ``RateLimiterPlugin`` (``cpex_rate_limiter``, memory backend, mode ``sequential``) on
  ``tool_pre_invoke`` and ``prompt_pre_fetch``, limiting each user to ``BY_USER``: too many for a
  benchmark call ever to be refused, but every call is counted;
- its built-in rate-limit middleware (per IP, user and team, on by default) kept on, its MCP tier
  raised likewise (the default, 100 requests a minute, would refuse the benchmark);
- ``SSRF_ALLOW_LOCALHOST=true``: it refuses loopback upstreams otherwise.

Its readiness is waited for on ``GET /health`` (no fixed sleeps); then, through its REST API
with an admin token (minted by its own ``mcpgateway.utils.create_jwt_token``), the upstream is
registered as a gateway named ``demo`` (``POST /gateways``, streamable HTTP), and a virtual
server is created with the tools it federated (``POST /servers``). Its MCP endpoint is
``/servers/ID/mcp``. ContextForge lists each tool as ``<gateway>-<tool>`` (``demo-lookup-order``):
``Started.tools`` maps the upstream's names to those.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import anyio
import httpx2

from procs import HOST, free_port, spawn, stop, wait_ready

VERSION = "1.1.0"
INSTALL = f'"mcp-contextforge-gateway[plugins]=={VERSION}"'
ADMIN = "admin@example.com"
#: The rate limiter's per-user limit: its sanity ceiling (it refuses more than 1,000,000 a window).
BY_USER = "1000000/s"
#: Fresh database: its migrations take 10-25 s on a loaded machine.
START_TIMEOUT_S = 120.0

PLUGINS_YAML = f"""\
plugins:
  - name: RateLimiter
    kind: cpex_rate_limiter.rate_limiter.RateLimiterPlugin
    hooks: [tool_pre_invoke, prompt_pre_fetch]
    mode: sequential
    priority: 10
    config:
      by_user: "{BY_USER}"
      backend: memory
"""

#: What the venv must import, and the version it holds (one line of JSON).
_PROBE = """
import json, importlib.metadata as m
out = {"version": m.version("mcp-contextforge-gateway")}
try:
    import cpex_rate_limiter.rate_limiter  # noqa: F401
except Exception as exc:
    out["rate_limiter"] = repr(exc)
print(json.dumps(out))
"""


class Started(NamedTuple):
    url: str  #: the virtual server's MCP endpoint
    headers: dict[str, str]  #: what every MCP request must carry (the bearer token)
    process: subprocess.Popen[bytes]
    tools: dict[str, str]  #: upstream tool name -> the name ContextForge lists it under


def default_venv(repo: Path) -> Path:
    return Path(os.environ.get("HALTWIRE_CONTEXTFORGE_VENV") or repo / ".venv-contextforge")


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def skipped_because(venv: Path) -> str | None:
    """Why ContextForge cannot be benchmarked from ``venv`` (one sentence), or None if it can."""
    install = f"python3.12 -m venv {venv} && {venv}/bin/pip install {INSTALL}"
    if not (venv / "bin" / "mcpgateway").exists() or not _python(venv).exists():
        return f"ContextForge is not installed in {venv}: {install}"
    try:
        probe = subprocess.run(
            [str(_python(venv)), "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the Python of {venv} does not run ({exc}): {install}"
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return f"ContextForge in {venv} does not import ({last}): {install}"
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    if "rate_limiter" in found:
        return (
            f"ContextForge's rate limiter plugin does not import in {venv} ({found['rate_limiter']}): "
            f"{venv}/bin/pip install {INSTALL}"
        )
    if found["version"] != VERSION:
        return f"{venv} holds ContextForge {found['version']}, the benchmark is set up for {VERSION}: {install}"
    return None


def _environment(workdir: Path, port: int, secret: str) -> dict[str, str]:
    # Not this interpreter's: ContextForge runs on its venv's Python.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(
        {
            "HOST": HOST,
            "PORT": str(port),
            "DATABASE_URL": f"sqlite:///{workdir / 'mcp.db'}",
            "TMPDIR": str(workdir),
            "JWT_SECRET_KEY": secret,
            "AUTH_ENCRYPTION_SECRET": secrets.token_urlsafe(48),
            "PLATFORM_ADMIN_EMAIL": ADMIN,
            "PLATFORM_ADMIN_PASSWORD": f"Pw-{secrets.token_urlsafe(18)}",
            "DEFAULT_USER_PASSWORD": f"Pw-{secrets.token_urlsafe(18)}",
            "AUTH_REQUIRED": "true",
            "LOG_LEVEL": "ERROR",
            "PLUGINS_ENABLED": "true",
            "PLUGINS_CONFIG_FILE": str(workdir / "plugins.yaml"),
            "RATE_LIMIT_MEDIUM_RPM": str(10**9),
            "RATE_LIMIT_MEDIUM_BURST": str(10**9),
            "SSRF_ALLOW_LOCALHOST": "true",
            # Its health check of the upstream (every 60 s by default) is an upstream request
            # that would land in another variant's count of upstream requests per call.
            "HEALTH_CHECK_INTERVAL": str(86_400),
        }
    )
    return env


async def _admin_token(venv: Path, env: dict[str, str], workdir: Path) -> str:
    """An admin JWT for a day, minted by ContextForge's own tool with the server's secret."""
    done = await anyio.run_process(
        [
            str(_python(venv)),
            "-m",
            "mcpgateway.utils.create_jwt_token",
            "--username",
            ADMIN,
            "--exp",
            "1440",
            "--secret",
            env["JWT_SECRET_KEY"],
        ],
        env=env,
        cwd=workdir,
        check=False,
    )
    token = done.stdout.decode().strip().splitlines()
    if done.returncode != 0 or not token:
        raise RuntimeError(f"ContextForge's create_jwt_token failed: {done.stderr.decode()[-2000:]}")
    return token[-1]


def _answer(response: httpx2.Response, what: str) -> object:
    if response.status_code >= 300:
        raise RuntimeError(f"ContextForge: {what}: HTTP {response.status_code} {response.text[:500]}")
    return response.json()


async def _register(base: str, token: str, upstream_mcp_url: str) -> tuple[str, dict[str, str]]:
    """Register the upstream, expose its tools in a virtual server: (server id, tool names)."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(base_url=base, headers=headers, timeout=60.0) as http:
        gateway = _answer(
            await http.post(
                "/gateways", json={"name": "demo", "url": upstream_mcp_url, "transport": "STREAMABLEHTTP"}
            ),
            "POST /gateways",
        )
        assert isinstance(gateway, dict)
        tools: list[dict[str, str]] = []
        with anyio.move_on_after(30):  # it federates the upstream's tools as it registers it
            while not tools:
                listed = _answer(await http.get("/tools"), "GET /tools")
                assert isinstance(listed, list)
                tools = [t for t in listed if t.get("gatewayId") == gateway["id"]]
                if not tools:
                    await anyio.sleep(0.1)
        if not tools:
            raise RuntimeError(f"ContextForge listed no tools of {upstream_mcp_url} in 30 s")
        server = _answer(
            await http.post(
                "/servers", json={"server": {"name": "bench", "associated_tools": [t["id"] for t in tools]}}
            ),
            "POST /servers",
        )
        assert isinstance(server, dict)
        return str(server["id"]), {t["originalName"]: t["name"] for t in tools}


def _prepare(workdir: Path) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "plugins.yaml").write_text(PLUGINS_YAML)


async def start(venv: Path, upstream_mcp_url: str, workdir: Path) -> Started:
    """Start ContextForge from ``venv`` in front of ``upstream_mcp_url``, its state in ``workdir``.

    The caller owns the process (``Started.process``) and stops it; on a failure here it is
    stopped before the error propagates.
    """
    _prepare(workdir)
    port = free_port()
    env = _environment(workdir, port, secrets.token_urlsafe(48))
    log = workdir / "contextforge.log"
    proc = spawn([str(venv / "bin" / "mcpgateway"), "--host", HOST, "--port", str(port)], log, env, workdir)
    try:
        token = await _admin_token(venv, env, workdir)
        base = f"http://{HOST}:{port}"
        await wait_ready(f"{base}/health", proc, log, timeout_s=START_TIMEOUT_S)
        server_id, tools = await _register(base, token, upstream_mcp_url)
    except BaseException:
        stop(proc)
        raise
    return Started(f"{base}/servers/{server_id}/mcp", {"Authorization": f"Bearer {token}"}, proc, tools)


if __name__ == "__main__":  # a check by hand: python benchmarks/contextforge.py [VENV]
    here = Path(__file__).resolve().parent.parent
    print(skipped_because(Path(sys.argv[1]) if len(sys.argv) > 1 else default_venv(here)) or "ready")
