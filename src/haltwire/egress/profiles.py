"""Egress profiles: which hosts and ports a run may reach through the egress proxy (rules only).

A profile is a list of allow entries, ``HOST:PORT``; everything else is denied. ``HOST`` is an
exact DNS name (``api.example.com``), a wildcard for its subdomains (``*.example.com``, not the
apex itself), an IPv4 address or network (``10.0.0.5``, ``10.0.0.0/8``), or an IPv6 address or
network in brackets (``[::1]``, ``[fd00::/8]``); ``PORT`` is a number or ``*``. The profile
``none`` allows nothing, and a stop switches every run it covers to it.

A target is judged in this order (``Profile.name_refusal``, then ``Profile.address_refusal``
for every address its name resolves to, by the caller, who connects only to those addresses):

1. a name (or address literal) that no entry allows, with the port: ``egress_denied``;
2. each resolved address: a global (public) one is allowed by the name's entry; any other
   (loopback, private, link-local, carrier-grade NAT, unique-local, reserved, unspecified) only
   when an address entry of the profile covers it with the port. So ``localhost:8080`` reaches
   127.0.0.1 only if ``127.0.0.1:8080`` is listed too: a name in an allow-list never opens the
   inside of the network by resolving to it (a DNS answer an attacker controls could).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Final

from haltwire import refusal
from haltwire.refusal import Refusal

#: The profile that allows nothing: the default, and what a stop switches a run to.
NONE: Final = "none"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")


def normal_host(host: str) -> str:
    """``host`` as entries and targets are compared: lower case, no trailing dot, no brackets."""
    return host.strip().lower().rstrip(".").removeprefix("[").removesuffix("]")


def _is_name(host: str) -> bool:
    labels = host.split(".")
    return 0 < len(host) <= 253 and all(_LABEL.fullmatch(label) for label in labels)


def address_of(host: str) -> IPAddress | None:
    """``host`` as an IP address when it is one (IPv4-mapped IPv6 taken as its IPv4 address)."""
    try:
        ip = ipaddress.ip_address(normal_host(host))
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def is_public(ip: IPAddress) -> bool:
    """Whether ``ip`` is a global (public) address; anything else needs an address entry."""
    return ip.is_global and not ip.is_multicast


@dataclass(frozen=True, slots=True)
class Entry:
    """One allow entry: a name (``suffix`` set for ``*.NAME``) or a network, and a port (None: any)."""

    text: str
    port: int | None
    name: str | None = None
    suffix: bool = False
    network: IPNetwork | None = None

    @classmethod
    def parse(cls, text: str) -> Entry:
        host, sep, port_text = text.strip().rpartition(":")
        if not sep or not host:
            raise ValueError(f"{text!r}: an allow entry is HOST:PORT (PORT a number or *)")
        if port_text == "*":
            port = None
        elif port_text.isdigit() and 1 <= int(port_text) <= 65535:
            port = int(port_text)
        else:
            raise ValueError(f"{text!r}: the port must be a number from 1 to 65535, or *")
        if host.startswith("["):
            if not host.endswith("]"):
                raise ValueError(f"{text!r}: an IPv6 host is written in brackets, [ADDRESS]:PORT")
            host = host[1:-1]
        elif ":" in host:
            raise ValueError(f"{text!r}: write an IPv6 host in brackets, [ADDRESS]:PORT")
        try:
            network = ipaddress.ip_network(host, strict=True)
        except ValueError as exc:
            if "/" in host or address_of(host) is not None:
                raise ValueError(f"{text!r}: {exc}") from None
            network = None
        if network is not None:
            return cls(text, port, network=network)
        name = normal_host(host)
        suffix = name.startswith("*.")
        if suffix:
            name = name[2:]
        if not _is_name(name) or "*" in name:
            raise ValueError(
                f"{text!r}: {host!r} is neither a host name, *.NAME, nor an IP address or network"
            )
        return cls(text, port, name=name, suffix=suffix)

    def allows_port(self, port: int) -> bool:
        return self.port is None or self.port == port

    def allows_name(self, name: str, port: int) -> bool:
        if self.name is None or not self.allows_port(port):
            return False
        return name.endswith("." + self.name) if self.suffix else name == self.name

    def covers(self, ip: IPAddress, port: int) -> bool:
        return self.network is not None and self.allows_port(port) and ip in self.network


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    entries: tuple[Entry, ...] = ()

    @classmethod
    def parse(cls, name: str, entries: list[str]) -> Profile:
        if name == NONE and entries:
            raise ValueError(f"the profile {NONE!r} allows nothing; give it no entries")
        return cls(name, tuple(Entry.parse(e) for e in entries))

    def name_refusal(self, run: str, host: str, port: int) -> Refusal | None:
        """Step 1 of the module's docstring: None if an entry allows ``host:port``."""
        target = f"{host}:{port}"
        ip = address_of(host)
        if ip is not None:
            allowed = any(e.covers(ip, port) for e in self.entries)
        else:
            name = normal_host(host)
            allowed = any(e.allows_name(name, port) for e in self.entries)
        return None if allowed else refusal.egress_denied(run, target, self.name)

    def address_refusal(self, run: str, host: str, port: int, ip: IPAddress) -> Refusal | None:
        """Step 2: None if ``ip``, an address ``host`` resolved to, may be reached on ``port``."""
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if is_public(ip) or any(e.covers(ip, port) for e in self.entries):
            return None
        return refusal.egress_private_address(run, f"{host}:{port}", str(ip), self.name)


NOTHING: Final = Profile(NONE)
