"""Host and Origin at the gateway's edge: protection against DNS rebinding.

A web page on ``evil.example`` whose name an attacker re-points at 127.0.0.1 can make the
browser send requests to a gateway on loopback; the browser then says ``Host: evil.example``
and ``Origin: http://evil.example``. So every request but the probes (``/healthz``,
``/readyz``) must name the gateway by a name it is served under, and a request from a web page must come from a page allowed to
call it. As the MCP SDK's ``TransportSecurityMiddleware`` does (which the gateway keeps off:
this check runs before the SDK, for the fast path too):

- ``Host`` is one of the allowed names (lower-cased) or the request is answered 421
  Misdirected Request; no ``Host``, or more than one, is refused too;
- ``Origin``, when sent, is allowed or the request is answered 403; no ``Origin`` is a program,
  not a browser page, and is let through (the bearer token is checked next).

Allowed hosts: ``localhost``, ``127.0.0.1`` and ``[::1]`` on any port (a DNS-rebinding page
can only send its own name, whatever the port; a tunnel or a port mapping in front of the
gateway changes the port), the bind host on any port when it is not a wildcard, and
``[gateway] allowed_hosts`` (``NAME``, ``NAME:PORT`` or ``NAME:*``). Allowed origins: the
request's own (its ``Origin`` names the ``Host`` already checked), pages on a loopback name
(``http`` or ``https``, any port), and ``[gateway] allowed_origins`` (``SCHEME://NAME[:PORT]``,
the port may be ``*``).

Cost: one pass over the headers and a lookup in a frozenset or two per request.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Final

log = logging.getLogger("haltwire.gateway")

#: The loopback names a local client uses, allowed on any port.
LOOPBACK: Final = ("localhost", "127.0.0.1", "[::1]")
#: Bind hosts that name no host: every interface.
WILDCARD_BINDS: Final = frozenset({"", "0.0.0.0", "::", "[::]"})

_NAME: Final = (
    r"(?:[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?)*|\[[0-9a-f:.]+\])"
)
_HOST_RE: Final = re.compile(rf"({_NAME})(?::([0-9]+|\*))?")
_ORIGIN_RE: Final = re.compile(rf"([a-z][a-z0-9+.-]*)://({_NAME})(?::([0-9]+|\*))?")
_DEFAULT_PORTS: Final = {"http": "80", "https": "443"}

_INVALID_HOST: Final = (
    b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Host header: this gateway '
    b'is not served under that name (see [gateway] allowed_hosts)"}}'
)
_INVALID_ORIGIN: Final = (
    b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Origin header: requests from '
    b'that origin are not accepted (see [gateway] allowed_origins)"}}'
)
#: How many distinct refused values are logged (one warning each): a flood logs no more.
_LOGGED_AT_MOST: Final = 100


def _port_problem(port: str | None) -> str | None:
    if port is None or port == "*" or 1 <= int(port) <= 65535:
        return None
    return "a port from 1 to 65535 (or '*' for any)"


def host_entry(value: str) -> str:
    """One ``allowed_hosts`` entry, lower-cased; ``ValueError`` says what is wrong with it."""
    entry = value.lower()
    if "://" in entry or "/" in entry:
        raise ValueError(
            f"{value!r}: a Host value is NAME or NAME:PORT, no scheme or path (say 'gw.internal:8800')"
        )
    if "*" in entry.removesuffix(":*"):
        raise ValueError(
            f"{value!r}: a wildcard name would accept any Host, which is what a DNS-rebinding page "
            "sends; list each name clients use (only the port may be '*': 'gw.internal:*')"
        )
    match = _HOST_RE.fullmatch(entry)
    if match is None:
        if entry.count(":") > 1 and not entry.startswith("["):
            raise ValueError(
                f"{value!r}: an IPv6 address goes in brackets, as in a Host header: '[::1]:8800'"
            )
        raise ValueError(f"{value!r}: not a host name, IPv4 address or [IPv6] address with an optional :PORT")
    if (problem := _port_problem(match.group(2))) is not None:
        raise ValueError(f"{value!r}: {problem}")
    return entry


def origin_entry(value: str) -> str:
    """One ``allowed_origins`` entry, lower-cased, without its scheme's default port."""
    entry = value.lower()
    if entry == "null":
        raise ValueError(
            "'null' is the origin of sandboxed pages and local files, which any site can make; it cannot be allowed"
        )
    if "*" in entry.removesuffix(":*"):
        raise ValueError(
            f"{value!r}: a wildcard origin would accept pages from any site; list each origin "
            "(only the port may be '*': 'http://localhost:*')"
        )
    if "://" not in entry:
        raise ValueError(f"{value!r}: an origin starts with its scheme, as in 'https://app.example.com'")
    if "/" in entry.split("://", 1)[1]:
        raise ValueError(
            f"{value!r}: an origin is SCHEME://NAME[:PORT], without a path (browsers send no '/')"
        )
    match = _ORIGIN_RE.fullmatch(entry)
    if match is None:
        raise ValueError(f"{value!r}: not an origin SCHEME://NAME[:PORT], as in 'https://app.example.com'")
    scheme, name, port = match.groups()
    if (problem := _port_problem(port)) is not None:
        raise ValueError(f"{value!r}: {problem}")
    if port is not None and _DEFAULT_PORTS.get(scheme) == port:
        return f"{scheme}://{name}"  # browsers leave the default port out
    return entry


def bind_name(host: str) -> str | None:
    """The name a ``Host`` header gives for a bind host, or None for a wildcard."""
    name = host.lower()
    if name in WILDCARD_BINDS:
        return None
    return f"[{name}]" if ":" in name and not name.startswith("[") else name


def _split(entries: Iterable[str]) -> tuple[frozenset[bytes], frozenset[bytes]]:
    """Exact values, and names allowed on any port (``NAME:*``)."""
    exact, any_port = set(), set()
    for entry in entries:
        if entry.endswith(":*"):
            any_port.add(entry[:-2].encode())
        else:
            exact.add(entry.encode())
    return frozenset(exact), frozenset(any_port)


class HostCheck:
    """The allowed ``Host`` and ``Origin`` values, precomputed; see the module's docstring.

    ``allowed_hosts`` and ``allowed_origins`` are entries checked by ``host_entry`` and
    ``origin_entry`` (the config does it); ``bind_host`` is where the gateway listens.
    """

    def __init__(self, allowed_hosts: Iterable[str], allowed_origins: Iterable[str], bind_host: str) -> None:
        names = list(LOOPBACK)
        if (bound := bind_name(bind_host)) is not None:
            names.append(bound)
        exact, any_port = _split(allowed_hosts)
        any_port |= {n.encode() for n in names}
        #: A name allowed on any port is allowed without one (its scheme's default port).
        self._hosts = exact | any_port
        self._host_names = any_port
        loopback_pages = [f"{scheme}://{n}:*" for scheme in ("http", "https") for n in LOOPBACK]
        exact, any_port = _split([*allowed_origins, *loopback_pages])
        self._origins = exact | any_port
        self._origin_names = any_port
        self._logged: set[tuple[str, bytes]] = set()

    def host_allowed(self, host: bytes | None) -> bool:
        if not host:
            return False
        host = host.lower()
        if host in self._hosts:
            return True
        name, sep, port = host.rpartition(b":")
        return bool(sep) and port.isdigit() and name in self._host_names

    def origin_allowed(self, origin: bytes | None, host: bytes) -> bool:
        """``host`` is the request's ``Host``, already allowed."""
        if origin is None:
            return True
        origin = origin.lower()
        if origin in self._origins:
            return True
        scheme_end = origin.find(b"://")
        if scheme_end > 0 and origin[scheme_end + 3 :] == host.lower():
            return True  # the request's own origin
        name, sep, port = origin.rpartition(b":")
        return bool(sep) and port.isdigit() and name in self._origin_names

    def refusal(self, headers: Iterable[tuple[bytes, bytes]]) -> tuple[int, bytes] | None:
        """None for an allowed request; else its status (421 or 403) and JSON-RPC error body."""
        host = origin = None
        hosts = 0
        for name, value in headers:
            if name == b"host":
                host = value
                hosts += 1
            elif name == b"origin":
                origin = value
        if host is None or hosts > 1 or not self.host_allowed(host):
            self._log("Host", host)
            return 421, _INVALID_HOST
        if not self.origin_allowed(origin, host):
            self._log("Origin", origin)
            return 403, _INVALID_ORIGIN
        return None

    def _log(self, header: str, value: bytes | None) -> None:
        key = (header, value or b"")
        if key in self._logged or len(self._logged) >= _LOGGED_AT_MOST:
            return
        self._logged.add(key)
        log.warning(
            "refused a request with %s %r (first time; add it to [gateway] allowed_%ss if it names this gateway)",
            header,
            (value or b"").decode("latin-1"),
            header.lower(),
        )
