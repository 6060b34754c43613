"""``haltwire up``: start the stack, say how to use it, and take it down on Ctrl-C or SIGTERM.

In order: the state folder and its secrets (``state``); every port checked free (a taken one is
one sentence and exit 2, before anything starts); the secrets this run made printed (once: later
runs name their folder only); the demo upstream and the control plane started, each waited for
until it answers (the control plane's operators' and enforcement listeners); then the gateway
and the executor started, and waited for after the control plane's agents' listener: the
gateway until ``/readyz``, the executor until it says it commits intents. Then the URLs, a stop
and a client call as commands that work as printed, and it waits. A part that does not start,
or exits later, is named in one sentence, the others stopped, exit 1.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from haltwire.demo.processes import Processes, Service, StackFailed
from haltwire.up import state
from haltwire.up.state import AGENT, SECRETS, Ports, Secrets, StateError, url

EXIT_FAILED = 1
EXIT_USAGE = 2
#: How often a running stack is checked for a process that exited.
WATCH_S = 0.2


class Stopping(Exception):
    """SIGTERM (or SIGINT) came: take the stack down and exit 0."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise Stopping


def haltwire_command() -> str:
    """``haltwire`` as a shell runs it here: the bare name when it is this installation's."""
    ours = Path(sys.executable).parent / "haltwire"
    found = shutil.which("haltwire")
    if found is not None and ours.exists() and Path(found).resolve() == ours.resolve():
        return "haltwire"
    return shlex.quote(str(ours)) if ours.exists() else f"{shlex.quote(sys.executable)} -m haltwire"


def run(args: argparse.Namespace) -> int:
    try:
        directory = state.prepare(Path(args.dir))
        ports = Ports.from_base(args.port_base)
        taken = ports.taken()
        if taken is not None:
            raise StateError(f"{taken}: stop it, or move every port with --port-base (say --port-base 9700)")
        secrets = state.load_secrets(directory)
        control_toml, gateway_toml = state.write_configs(directory, ports, secrets)
    except StateError as exc:
        print(f"haltwire up: {exc}", file=sys.stderr)
        return EXIT_USAGE
    processes = Processes(directory / "logs")
    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        _print_made(secrets)
        _start(processes, ports, secrets, control_toml, gateway_toml)
        _print_ready(directory, ports, secrets)
        while True:
            processes.check_alive()
            time.sleep(WATCH_S)
    except Stopping:
        print("haltwire up: stopping every process", file=sys.stderr, flush=True)
        return 0
    except StackFailed as exc:
        print(f"haltwire up: {_sentence(exc)}; stopping the others", file=sys.stderr, flush=True)
        return EXIT_FAILED
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C does not cut the shutdown short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        processes.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _sentence(exc: StackFailed) -> str:
    """``StackFailed``'s first line, with the last line of the process's stderr as the reason."""
    head, _, tail = str(exc).partition("\n")
    last = next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "")
    return f"{head.split('; the end of its stderr')[0]} ({last})" if last else head


def _start(processes: Processes, ports: Ports, secrets: Secrets, control_toml: Path, gateway_toml: Path) -> None:
    env = secrets.env()
    spawn = processes.spawn
    upstream = spawn("demo upstream", "-m", "haltwire", "demo", "upstream", "--port", str(ports.upstream))
    control = spawn("control plane", "-m", "haltwire", "control", "--config", str(control_toml), env=env)
    _ready(upstream, f"{url(ports.upstream)}/state")
    # The gateway and the executor need the enforcement listener only; the agents' listener is
    # served by a child process of the control plane's, waited for while they start.
    for port, listener in ((ports.admin, "operators' listener"), (ports.enforcement, "enforcement listener")):
        _ready(control, f"{url(port)}/healthz", listener)
    gateway = spawn("gateway", "-m", "haltwire", "gateway", "--config", str(gateway_toml), env=env)
    executor = spawn("executor", "-m", "haltwire", "executor", "--config", str(gateway_toml), env=env)
    _ready(control, f"{url(ports.control)}/healthz", "agents' listener")
    _ready(gateway, f"{url(ports.gateway)}/readyz")
    _ready(executor, "committing intents")


def _ready(service: Service, what: str, part: str = "") -> None:
    """Wait for ``service`` (an HTTP URL to answer 200, or a line on its stderr), saying so."""
    started = time.monotonic()
    name = f"{service.name}'s {part}" if part else service.name
    print(f"haltwire up: starting the {name} ({what}) ...", file=sys.stderr, flush=True)
    if what.startswith("http"):
        service.wait_http(what)
    else:
        service.wait_log(what)
    took = time.monotonic() - started
    print(f"haltwire up: the {name} is ready ({took:.1f} s)", file=sys.stderr, flush=True)


def _print_made(secrets: Secrets) -> None:
    """The secrets this run made, before anything starts: shown once, whatever happens next."""
    if not secrets.made:
        print(f"Secrets: the first run's, in {secrets.folder}/ (not shown again)", flush=True)
        return
    lines = ["Secrets made now, shown this once (each in its own file, mode 0600):"]
    lines += [f"  {SECRETS[name]}: {secrets.values[name]}" for name in secrets.made]
    lines.append(f"  in {secrets.folder}/")
    print("\n".join(lines), flush=True)


def _print_ready(directory: Path, ports: Ports, secrets: Secrets) -> None:
    hw = haltwire_command()
    admin, token = url(ports.admin), f'"$(cat {shlex.quote(str(secrets.path("operator.token")))})"'
    agent_file = shlex.quote(str(secrets.path("agent.token")))
    lines = [
        "",
        f"haltwire is up (state, configs and logs in {directory}):",
        f"  gateway (MCP)            {url(ports.gateway)}/mcp",
        f"  control plane, agents    {url(ports.control)}   (runs, leases: the runtime SDK)",
        f"  control plane, admin     {admin}   (the operators' API: stops, audit, reports; {admin}/docs)",
        f"  dashboard                {admin}/dashboard/   (sign in with the operator or viewer token)",
        f"  demo upstream            {url(ports.upstream)}/mcp",
        "",
    ]
    shown = "made now and shown above, once" if secrets.made else "made on the first run, not shown again"
    lines.append(f"Secrets: {shown}; in {secrets.folder}/ ({', '.join(SECRETS)}; mode 0600)")
    lines += [
        "",
        f"Call a tool through the gateway as {AGENT['agent']} (a real MCP client):",
        f"  {hw} call {url(ports.gateway)}/mcp lookup_order '{{\"order_id\": \"A-1\"}}' --token \"$(cat {agent_file})\"",
        f"Stop {AGENT['agent']} (its next call is refused `stopped`), list the stops, clear one:",
        f"  {hw} stop --url {admin} --token {token} --agent {AGENT['agent']} --reason \"trying haltwire\"",
        f"  {hw} stops --url {admin} --token {token}",
        f"  {hw} clear STOP_ID --url {admin} --token {token} --reason \"done trying\"",
        "",
        "Ctrl-C stops every process.",
    ]
    print("\n".join(lines), flush=True)
