"""The server name (SNI) a TLS ClientHello asks for, read from the first bytes of a tunnel (rules only).

No TLS library reads a ClientHello it did not make without terminating the connection, and the
proxy never terminates TLS; the format (RFC 8446 4.1.2 and 5.1, RFC 6066 3) is small and fixed,
so it is parsed here by hand. ``client_hello`` answers, for the bytes a client has sent so far:

- ``NOT_TLS``: the first byte is not a TLS handshake record, so no TLS server would take it as
  one (a plain TCP protocol in a tunnel): there is no SNI to match;
- ``NEED_MORE``: a handshake record has begun and the ClientHello is not whole yet;
- ``MALFORMED``: a handshake that does not parse as a ClientHello, or one past ``MAX_HELLO``
  bytes: the proxy closes the tunnel (a hello it cannot read could name any host);
- a ``Hello``: the ClientHello is whole; ``sni`` is its ``host_name``, or None if it names none.

The ClientHello may span several records; only handshake records are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: A ClientHello larger than this is refused (post-quantum key shares make them ~2 KiB today).
MAX_HELLO: Final = 65_536
_HANDSHAKE: Final = 22
_CLIENT_HELLO: Final = 1
_SERVER_NAME: Final = 0
_HOST_NAME: Final = 0


class _Mark:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NOT_TLS: Final = _Mark("NOT_TLS")
NEED_MORE: Final = _Mark("NEED_MORE")
MALFORMED: Final = _Mark("MALFORMED")


@dataclass(frozen=True, slots=True)
class Hello:
    sni: str | None


class _Malformed(Exception):
    pass


def client_hello(data: bytes) -> Hello | _Mark:
    """See the module's docstring."""
    if not data:
        return NEED_MORE
    if data[0] != _HANDSHAKE:
        return NOT_TLS
    if len(data) > MAX_HELLO + 5 * (MAX_HELLO // 16_384 + 1):
        return MALFORMED
    handshake = b""
    at = 0
    while at + 5 <= len(data):
        if data[at] != _HANDSHAKE:
            return MALFORMED  # the hello is not whole, and something else came
        length = int.from_bytes(data[at + 3 : at + 5], "big")
        if at + 5 + length > len(data):
            break
        handshake += data[at + 5 : at + 5 + length]
        at += 5 + length
        if len(handshake) >= 4:
            if handshake[0] != _CLIENT_HELLO:
                return MALFORMED
            needed = 4 + int.from_bytes(handshake[1:4], "big")
            if needed > MAX_HELLO:
                return MALFORMED
            if len(handshake) >= needed:
                try:
                    return Hello(_server_name(handshake[4:needed]))
                except (_Malformed, IndexError, UnicodeDecodeError):
                    return MALFORMED
    return NEED_MORE


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise _Malformed
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def number(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def vector(self, length_bytes: int) -> bytes:
        return self.take(self.number(length_bytes))

    @property
    def left(self) -> int:
        return len(self.data) - self.at


def _server_name(body: bytes) -> str | None:
    hello = _Reader(body)
    hello.take(2 + 32)  # legacy_version, random
    hello.vector(1)  # legacy_session_id
    hello.vector(2)  # cipher_suites
    hello.vector(1)  # legacy_compression_methods
    if hello.left == 0:
        return None  # no extensions at all
    extensions = _Reader(hello.vector(2))
    found: str | None = None
    seen: set[int] = set()
    while extensions.left:
        kind = extensions.number(2)
        data = extensions.vector(2)
        if kind in seen:
            raise _Malformed  # RFC 8446 4.2: one of each; two server names could mean two readings
        seen.add(kind)
        if kind == _SERVER_NAME:
            found = _host_name(data)
    return found


def _host_name(data: bytes) -> str:
    names = _Reader(_Reader(data).vector(2))
    while names.left:
        kind = names.number(1)
        name = names.vector(2)
        if kind == _HOST_NAME:
            text = name.decode("ascii")
            if not text or any(c in text for c in "\x00/\\@: "):
                raise _Malformed
            return text.lower().rstrip(".")
    raise _Malformed
