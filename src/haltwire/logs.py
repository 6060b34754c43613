"""Logging for every ``haltwire`` server command: one set-up, two formats, and the refusal line.

``--log-format text|json`` and ``--log-level`` are added to ``gateway``, ``control``, ``executor``
and ``egress`` by ``add_arguments``, and applied by ``configure`` before anything logs. In JSON,
each record is one line: ``ts``, ``level``, ``logger``, ``message``, and the fields a record was
given as ``extra`` (a refusal's ``identity``, ``code``, ``run``; an access line's ``method``,
``path``, ``status``, ``duration_ms``), so a log pipeline reads them without parsing sentences.
``--access-log`` logs each HTTP request at info on ``haltwire.access`` (``haltwire.access_log``).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any, Final, TextIO

from haltwire.identity import Identity
from haltwire.refusal import Refusal

FORMATS: Final = ("text", "json")
LEVELS: Final = ("debug", "info", "warning", "error")
#: A record's own attributes; anything else on it came as ``extra`` and is written as a field.
_STANDARD: Final = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The logging options of a server command."""
    parser.add_argument("--log-format", choices=FORMATS, default="text", help="log lines as text or JSON")
    parser.add_argument(
        "--log-level", choices=LEVELS, default=None, help="the least level logged (default warning; -v: debug)"
    )
    parser.add_argument(
        "--access-log", action="store_true", help="log every HTTP request at info (haltwire.access)"
    )


def configure(fmt: str = "text", level: str = "warning", stream: TextIO | None = None) -> None:
    """Set up the root logger of a command's process: one handler, ``fmt``, ``level``. Replaces any
    handler already there, so it may be called again (the tests do)."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def configure_from(args: argparse.Namespace) -> None:
    """``configure`` from a command's options (``add_arguments``; ``-v`` means debug)."""
    level = args.log_level or ("debug" if getattr(args, "verbose", False) else "warning")
    if args.access_log and level == "warning":
        level = "info"  # asked for: an access log at warning would say nothing
    configure(args.log_format, level)
    # The access log is asked for by its option, not by the level.
    logging.getLogger("haltwire.access").disabled = not args.access_log


def argv(args: argparse.Namespace) -> list[str]:
    """The logging options of ``args`` as a command line (for a child process of the command)."""
    out = ["--log-format", args.log_format]
    level = args.log_level or ("debug" if getattr(args, "verbose", False) else None)
    if level is not None:
        out += ["--log-level", level]
    return [*out, "--access-log"] if args.access_log else out


def log_refusal(log: logging.Logger, identity: Identity, what: str, run: str | None, r: Refusal) -> None:
    """The one log line of a refusal answered to an agent: at info, with who, what, code and run."""
    if log.isEnabledFor(logging.INFO):
        log.info(
            "refused %s of %s (run %s): %s",
            what,
            identity.agent,
            run,
            r.code,
            extra={
                "identity": identity.agent,
                "tenant": identity.tenant,
                "version": identity.version,
                "code": r.code,
                "retryable": r.retryable,
                "run": run,
                "call": what,
            },
        )
