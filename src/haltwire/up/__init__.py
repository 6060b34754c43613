"""``haltwire up``: the control plane, a gateway, the executor and a demo upstream, each its own
process, on the embedded default (SQLite, counters in memory), from one command.

``state`` keeps the state folder (default ``./.haltwire``): the secrets it generates (one file
each, mode 0600, made once and reused), the ports, and the configs, which name no secret (tokens
as their SHA-256, the others as environment variables the processes are given). ``command``
starts the processes (``haltwire.demo.processes``), waits until each is ready, prints what to do
with them, and takes them all down on Ctrl-C or SIGTERM. ``call`` is the client it prints:
``haltwire call`` calls one tool through a gateway with the official MCP client.

The parsers are here, light; each command imports its module when it runs.
"""

from __future__ import annotations

import argparse
from typing import Final

#: The ports ``haltwire up`` uses by default (``state.PORTS``); ``--port-base`` moves them all.
PORT_BASE: Final = 8700


def _up(args: argparse.Namespace) -> int:
    from haltwire.up.command import run

    return run(args)


def _call(args: argparse.Namespace) -> int:
    from haltwire.up.call import run

    return run(args)


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``haltwire up`` and ``haltwire call``."""
    up = sub.add_parser(
        "up", help="run the control plane, a gateway, the executor and a demo upstream, each its own process"
    )
    up.add_argument("--dir", default=".haltwire", help="the state folder: configs, secrets, database, logs (default ./.haltwire)")
    up.add_argument(
        "--port-base",
        type=int,
        default=PORT_BASE,
        help="move every port: the control plane on BASE to BASE+2, the gateway on BASE+100, "
        f"the demo upstream on BASE+200 (default {PORT_BASE})",
    )
    up.set_defaults(func=_up)
    call = sub.add_parser("call", help="call one tool through a gateway (the official MCP client) and print the result")
    call.add_argument("url", help="the gateway's MCP URL, http://HOST:PORT/mcp")
    call.add_argument("tool")
    call.add_argument("arguments", nargs="?", default="{}", help="the arguments, a JSON object (default {})")
    call.add_argument("--token", required=True, help="the agent's bearer token")
    call.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the result")
    call.set_defaults(func=_call)
