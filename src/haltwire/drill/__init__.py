"""``haltwire drill``: measure the time from a stop to the last side effect, rung by rung.

A client of the other processes, as the demos are: it starts a stack of its own
(``drill.stack``), runs canary agents through it (``drill.agents``), issues and clears stops
(``drill.rungs``), and judges the figures against the agent class's ``time_to_stop_s``
(``drill.figures``, ``drill.html`` for the report). ``drill.canary`` is the upstream that
records every side effect; ``drill.remote`` drills a running stack instead of its own.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_running_stack_arguments(parser: argparse.ArgumentParser) -> None:
    """``haltwire drill``'s options for a running stack (``drill.remote``): its listeners, the drill
    identities' tokens, where the canary listens, the target."""
    urls = {"--control": "a running control plane's admin listener", "--agents": "its agents' listener",
            "--gateway": "its gateway", "--canary-url": "a canary kept running: the drill starts none"}  # fmt: skip
    for flag, what in urls.items():
        parser.add_argument(flag, default=None, metavar="URL", help=what)
    parser.add_argument("--token-file", type=Path, default=None, metavar="FILE", help="the drill's tokens (TOML)")
    parser.add_argument("--canary-host", default="127.0.0.1", help="where the canary listens (default 127.0.0.1)")
    parser.add_argument("--canary-port", type=int, default=8790, help="the canary's port (default 8790)")
    parser.add_argument("--target-s", type=float, default=None, help="the target (default: the class's ttl_s)")
