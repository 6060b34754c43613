"""The kill switch file: a list of suspended identities, consulted on every call.

The file is JSON, ``{"suspended": ["ops-bot", ...]}``, written by an operator, best with
``haltwire suspend AGENT --config GATEWAY.toml`` (or ``--file PATH``; and ``unsuspend``), which
replace it atomically. The gateway stats it on every call and re-reads it only when its inode,
size or modification time changed, so the check costs one ``stat``.

- Missing file: nobody is suspended.
- Half-written or malformed file: keep the last list that parsed, and log it. Failing
  open would lift every suspension; failing closed would suspend everyone.
- Cleared file: the next call sees it, on the same connection, with no restart.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger("haltwire.killswitch")


class SuspensionFile:
    def __init__(self, path: str | Path | None) -> None:
        self.path = None if path is None else os.fspath(path)
        self._seen: tuple[int, int, int] | None = None
        self._suspended: frozenset[str] = frozenset()

    def suspended(self) -> frozenset[str]:
        """The identities suspended now."""
        if self.path is None:
            return self._suspended
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._seen = None
            self._suspended = frozenset()
            return self._suspended
        except OSError as exc:
            log.error("kill switch %s cannot be read (%s); keeping the last good list", self.path, exc)
            return self._suspended
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if stamp != self._seen:
            self._seen = stamp
            self._reload()
        return self._suspended

    def is_suspended(self, agent: str) -> bool:
        return agent in self.suspended()

    def _reload(self) -> None:
        assert self.path is not None
        try:
            with open(self.path, "rb") as f:
                self._suspended = frozenset(parse_suspensions(f.read()))
        except FileNotFoundError:
            self._suspended = frozenset()
        except (OSError, ValueError) as exc:
            log.error("kill switch %s is malformed (%s); keeping the last good list", self.path, exc)


def parse_suspensions(raw: bytes) -> list[str]:
    """The list in a kill-switch file's bytes. Raises ValueError when it is not the expected JSON."""
    data = json.loads(raw)
    listed = data.get("suspended") if isinstance(data, dict) else None
    if not isinstance(listed, list) or not all(isinstance(a, str) for a in listed):
        raise ValueError('expected {"suspended": ["agent-id", ...]}')
    return listed


def read_suspensions(path: str | Path) -> list[str]:
    """The list in the file now; a missing file is an empty list. Raises ValueError if malformed."""
    try:
        return parse_suspensions(Path(path).read_bytes())
    except FileNotFoundError:
        return []
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def write_suspensions(path: str | Path, agents: list[str]) -> None:
    """Write the kill switch atomically (write a temporary file, then rename over the old one).
    Raises ``OSError`` with a sentence naming the file when it cannot be written."""
    target = Path(path)
    if not target.parent.is_dir():
        raise OSError(f"{target}: the folder {target.parent} does not exist")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps({"suspended": sorted(set(agents))}))
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OSError(f"{target}: cannot write the kill switch: {exc.strerror or exc}") from None
