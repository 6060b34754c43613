"""The lease desk's counts shared between ``haltwire control``'s two processes, so the admin
listener's ``/metrics`` counts the grants the agents' process makes (where runtimes register and
renew). The main process owns 16 bytes of shared memory (a memfd, or an unlinked file where there
is none) and passes its descriptor to each child it starts; the child writes its desk's two
totals there at each grant or refusal, starting from what a child before it left, so a restart
does not set the count back. Two plain 64-bit words: a reader may see one grant late, never a
count from another process's memory."""

from __future__ import annotations

import mmap
import os
import struct
import tempfile
from typing import Final

_WORDS: Final = struct.Struct("<QQ")


class SharedCounts:
    """``granted`` and ``refused``, in memory another process maps too."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._memory = mmap.mmap(fd, _WORDS.size)

    @classmethod
    def create(cls) -> SharedCounts:
        """Zeroed counts of the main process's own, their descriptor inheritable by its children."""
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create("haltwire-lease-counts", 0)
        else:
            fd, path = tempfile.mkstemp(prefix="haltwire-lease-counts-")
            os.unlink(path)
        os.ftruncate(fd, _WORDS.size)
        return cls(fd)

    def read(self) -> tuple[int, int]:
        granted, refused = _WORDS.unpack_from(self._memory, 0)
        return int(granted), int(refused)

    def write(self, granted: int, refused: int) -> None:
        _WORDS.pack_into(self._memory, 0, granted, refused)
