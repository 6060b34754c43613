"""``haltwire suspend`` and ``haltwire unsuspend``: the kill-switch file a gateway reads."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from haltwire.config import ConfigError


def suspend(args: argparse.Namespace) -> int:
    """``haltwire suspend`` and ``unsuspend``: add or remove agents, then say where it wrote."""
    from haltwire.gateway.killswitch import read_suspensions, write_suspensions

    try:
        path = Path(args.file) if args.file is not None else _suspended_file(args.config)
        current = set(read_suspensions(path))
        wanted = current | set(args.agents) if args.command == "suspend" else current - set(args.agents)
        write_suspensions(path, sorted(wanted))
    except (ValueError, OSError, ConfigError) as exc:
        print(f"haltwire {args.command}: {exc}", file=sys.stderr)
        return 2
    # Where it wrote: a relative --file is relative to here, not to any gateway's config.
    print(f"suspended: {', '.join(sorted(wanted)) or '(nobody)'} (in {path.resolve()})")
    return 0


def _suspended_file(config_path: str) -> Path:
    """The kill-switch file a gateway's config names (relative to the config, as the gateway reads it)."""
    from haltwire.gateway.config import load_config

    path = load_config(config_path).gateway.suspended_file
    if path is None:
        raise ConfigError(f"{config_path}: gateway.suspended_file is not set: this gateway has no kill-switch file")
    return path
