"""One client connection to the egress proxy: read its request head, judge it, then relay.

HTTP parsing is h11 (already installed with uvicorn, which the gateway uses): a sans-I/O
HTTP/1.1 parser that bounds the head it buffers (``max_incomplete_event_size``), frames bodies
both ways, and hands back, after a ``CONNECT`` is answered 2xx, the bytes that came after the
head (``trailing_data``). uvicorn and Starlette are servers for applications, which see neither
``CONNECT`` nor the raw socket a tunnel needs; aiohttp's server the same. The sockets are
anyio's.

A connection carries one request: a ``CONNECT HOST:PORT`` (a tunnel: bytes both ways, TLS
never intercepted) or an absolute-URI ``http://`` request (forwarded, then the connection is
closed: ``Connection: close``, so no second request on it escapes the checks). In this order,
before any byte reaches a target:

1. the head arrives whole within ``header_timeout_s`` (else the connection is closed with no
   answer: a slowloris) and within ``max_head_bytes`` (else 431); the connection cap is the
   listener's (``haltwire.egress.server``);
2. the request is a ``CONNECT`` to ``HOST:PORT`` or an absolute ``http://`` URI: else 400
   ``proxy_request_invalid`` (``https://`` URIs too: a client sends those as ``CONNECT``);
3. ``Proxy-Authorization`` carries a lease token whose signature (the proxy's keys) and expiry
   (the proxy's clock) hold, or a broker credential (``[broker]``) that holds: else 407 with
   ``Proxy-Authenticate`` (``haltwire.egress.auth``);
4. the watch is current and no stop covers the run's scopes, nor fences its lease: else 503
   ``registry_unreachable``, 403 ``stopped`` or 403 ``lease_invalid`` (``haltwire.leasecheck``);
5. the run's agent's profile allows the host and port: else 403 ``egress_denied``;
6. the host resolves (an address literal is not resolved), and every address it resolves to is
   allowed (``Profile.address_refusal``): else 403 ``egress_denied``, or 503
   ``upstream_unavailable`` when it does not resolve. DNS rebinding: the proxy connects only to
   the addresses it checked, never resolving the name again;
7. the connection is registered for its run (``OpenConnections.open``, which judges the stops
   again: one may have landed while the name resolved), and the target is connected to within
   what is left of ``connect_timeout_s`` (else 503); from then on a stop, the lease's expiry or
   a stale watch closes it (``haltwire.egress.connections``);
8. in a tunnel, the client's first bytes: a TLS ClientHello whose SNI names a host the profile
   does not allow on the port (or that cannot be read) closes the tunnel before any byte
   reaches the target (``_sni_screen``); bytes that are not TLS go on.
"""

from __future__ import annotations

import contextlib
import http
import ipaddress
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio
import anyio.abc
import h11

from haltwire import refusal
from haltwire.egress import relay, sni
from haltwire.egress.auth import CHALLENGE, Broker, caller
from haltwire.egress.config import EgressSection, Profiles
from haltwire.egress.connections import POINT, Connection, Kind, OpenConnections
from haltwire.egress.profiles import IPAddress, Profile, address_of, normal_host
from haltwire.leasecheck import run_refusal
from haltwire.metrics import EgressMetrics
from haltwire.refusal import Refusal
from haltwire.tokens import LeaseClaims, LeaseKeys

log = logging.getLogger("haltwire.egress")
#: One line per relayed request with ``--access-log`` (disabled otherwise: ``haltwire.logs``).
access = logging.getLogger("haltwire.access")

#: Bytes read from a socket at once.
CHUNK = 65_536


@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


class Proxy:
    """What every connection shares: the section's bounds, keys, profiles, stops and open connections."""

    def __init__(
        self,
        section: EgressSection,
        keys: LeaseKeys,
        connections: OpenConnections,
        *,
        broker: Broker | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.section = section
        self.keys = keys
        self.broker = broker
        self.profiles = Profiles(section)
        self.connections = connections
        self._clock = clock
        #: What ``[egress] metrics_port`` serves.
        self.metrics = EgressMetrics()

    async def _refuse(
        self, client: anyio.abc.SocketStream, r: Refusal, *, status: int | None = None, run: str | None = None
    ) -> None:
        """Answer ``r`` (``_answer``), counted and logged at info with its run when known."""
        self.metrics.refused(r)
        log.info("refused a connection (run %s): %s", run, r.code, extra={"code": r.code, "run": run})
        await _answer(client, r, status=status)

    async def handle(self, client: anyio.abc.SocketStream) -> None:
        """Serve one client connection (steps 1 to 8), then close it."""
        async with client:
            conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.section.max_head_bytes)
            try:
                request = await self._head(client, conn)
            except h11.RemoteProtocolError as exc:
                too_large = exc.error_status_hint == 431
                why = "the request head is too large" if too_large else "the request head is malformed"
                await self._refuse(client, refusal.proxy_request_invalid(why), status=431 if too_large else 400)
                return
            if request is None:
                return  # closed, or no whole head in time: nothing to answer
            await self._request(client, conn, request)

    async def _head(self, client: anyio.abc.SocketStream, conn: h11.Connection) -> h11.Request | None:
        """Step 1. The deadline covers the whole head, however slowly it trickles in; no more than
        ``max_head_bytes`` are read before the head is whole (h11's own bound applies only to a
        head that arrives in pieces), so a head past it is refused however it arrives."""
        limit = self.section.max_head_bytes
        fed = 0
        with anyio.move_on_after(self.section.header_timeout_s):
            while True:
                event = conn.next_event()
                if isinstance(event, h11.Request):
                    return event
                if event is not h11.NEED_DATA:
                    return None
                if fed >= limit:
                    raise h11.RemoteProtocolError("the request head is too large", error_status_hint=431)
                try:
                    data = await client.receive(min(CHUNK, limit - fed))
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return None
                fed += len(data)
                conn.receive_data(data)
        return None

    async def _request(
        self, client: anyio.abc.SocketStream, conn: h11.Connection, request: h11.Request
    ) -> None:
        target = _target(request)
        if isinstance(target, Refusal):
            await self._refuse(client, target)
            return
        header = _header(request, b"proxy-authorization")
        with anyio.move_on_after(self.section.connect_timeout_s) as fetching:  # a broker's JWKS
            claims = await caller(self.keys, header, self._clock(), self.broker)
        if fetching.cancelled_caught:
            claims = refusal.proxy_auth_required("the broker's keys could not be fetched in time")
        if isinstance(claims, Refusal):
            await self._refuse(client, claims, status=407)
            return
        refused = run_refusal(self.connections.watch, claims, POINT)
        profile = self.profiles.for_agent(claims.agent)
        if refused is None:
            refused = profile.name_refusal(claims.run, target.host, target.port)
        if refused is not None:
            await self._refuse(client, refused, run=claims.run)
            return
        opened: Connection | None = None
        upstream: anyio.abc.SocketStream | None = None
        with anyio.move_on_after(self.section.connect_timeout_s):  # resolving and connecting
            addresses = await _resolve(target)
            if isinstance(addresses, Refusal):
                await self._refuse(client, addresses, run=claims.run)
                return
            for ip in addresses:
                refused = profile.address_refusal(claims.run, target.host, target.port, ip)
                if refused is not None:
                    await self._refuse(client, refused, run=claims.run)
                    return
            kind: Kind = "tunnel" if request.method == b"CONNECT" else "forward"
            registered = self.connections.open(claims, kind, str(target))
            if isinstance(registered, Refusal):
                await self._refuse(client, registered, run=claims.run)
                return
            opened = registered
            upstream = await _connect(addresses, target.port)
        if opened is None or upstream is None:  # timed out, or no address accepted
            if opened is not None:
                self.connections.closed(opened)
            await self._refuse(client, refusal.target_unreachable(str(target)), run=claims.run)
            return
        await self._relay(client, conn, request, target, opened, upstream, claims)

    async def _relay(
        self,
        client: anyio.abc.SocketStream,
        conn: h11.Connection,
        request: h11.Request,
        target: Target,
        opened: Connection,
        upstream: anyio.abc.SocketStream,
        claims: LeaseClaims,
    ) -> None:
        tunnel = request.method == b"CONNECT"
        self.metrics.relayed()
        self.metrics.tunnels += tunnel
        try:
            with opened.scope:  # a stop, the lease's expiry or a stale watch cancels it
                async with upstream:
                    if request.method == b"CONNECT":
                        await _send(
                            client,
                            conn,
                            h11.Response(status_code=200, headers=[], reason=b"Connection established"),
                        )
                        first = conn.trailing_data[0]
                        screen = _sni_screen(opened, self.profiles.for_agent(claims.agent), target)
                        await relay.tunnel(client, upstream, opened, first, screen)
                    else:
                        await relay.forward(
                            client, conn, upstream, request, opened, self.section.idle_timeout_s
                        )
        finally:
            self.metrics.tunnels -= tunnel
            self.connections.closed(opened)
            if access.isEnabledFor(logging.INFO):
                method = request.method.decode("latin-1")
                fields = {"method": method, "target": str(target), "run": claims.run, "cut_by": opened.cut_by}
                access.info("%s %s (run %s)", method, target, claims.run, extra=fields)
        if conn.our_state is h11.SEND_RESPONSE:
            # Nothing was answered yet (cut before the 200 or before the target's response, or the
            # target closed without one): the client is told why, not left with a bare close.
            cut = opened.cut_by is not None
            refused = run_refusal(self.connections.watch, claims, POINT) if cut else None
            if refused is None and conn.their_state is h11.ERROR:
                refused = refusal.proxy_request_invalid("the request body is malformed")
            if refused is None:
                refused = (
                    refusal.lease_expired(claims.run) if cut else refusal.target_unreachable(str(target))
                )
            with anyio.move_on_after(self.section.header_timeout_s):  # a client that does not read
                await self._refuse(client, refused, run=claims.run)


def _sni_screen(opened: Connection, profile: Profile, target: Target) -> Callable[[bytes], bool | None]:
    """Step 8, in a tunnel: the TLS SNI of the client's ClientHello, when it sends one, must be the
    ``CONNECT``'s host or another host the profile allows on that port; a ClientHello the proxy
    cannot read closes the tunnel too (``haltwire.egress.sni``). A tunnel that does not start with
    a TLS handshake has no SNI and goes on."""
    host = normal_host(target.host)

    def screen(data: bytes) -> bool | None:
        hello = sni.client_hello(data)
        if hello is sni.NEED_MORE:
            return None
        if hello is sni.NOT_TLS:
            return True
        if isinstance(hello, sni.Hello):
            name = hello.sni
            if (
                name is None
                or name == host
                or profile.name_refusal(opened.claims.run, name, target.port) is None
            ):
                return True
            opened.cut_by = f"its TLS SNI {name[:255]!r}, which profile {profile.name} does not allow"
            return False
        opened.cut_by = "a TLS ClientHello the proxy cannot read"
        return False

    return screen


def _header(request: h11.Request, name: bytes) -> str | None:
    for key, value in request.headers:
        if key == name:
            return value.decode("latin-1")
    return None


def _target(request: h11.Request) -> Target | Refusal:
    """Step 2: the host and port a request asks for."""
    raw = request.target.decode("latin-1")
    if request.method == b"CONNECT":
        parts = urlsplit(f"//{raw}")
        default = None
    else:
        parts = urlsplit(raw)
        if parts.scheme != "http":
            why = (
                "an https:// URI is asked for with CONNECT"
                if parts.scheme == "https"
                else "a forward proxy takes absolute http:// URIs and CONNECT"
            )
            return refusal.proxy_request_invalid(why)
        default = 80
    try:
        port = parts.port if parts.port is not None else default
    except ValueError:
        port = None
    host = parts.hostname
    if not host or port is None or parts.username is not None:
        return refusal.proxy_request_invalid(f"no HOST:PORT in {raw[:200]!r}")
    return Target(host, port)


async def _resolve(target: Target) -> list[IPAddress] | Refusal:
    """Step 6's resolution: every address of the host (in the order the resolver gives them)."""
    literal = address_of(target.host)
    if literal is not None:
        return [literal]
    try:
        infos = await anyio.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return refusal.target_unreachable(str(target))
    out: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        ip = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
        if ip not in out:
            out.append(ip)
    return out or refusal.target_unreachable(str(target))


async def _connect(addresses: list[IPAddress], port: int) -> anyio.abc.SocketStream | None:
    """The first checked address that accepts, or None (the caller bounds the time)."""
    for ip in addresses:
        try:
            return await anyio.connect_tcp(str(ip), port)
        except OSError:
            continue
    return None


async def _send(client: anyio.abc.SocketStream, conn: h11.Connection, event: h11.Event) -> None:
    data = conn.send(event)
    if data:
        await client.send(data)


async def _answer(client: anyio.abc.SocketStream, r: Refusal, *, status: int | None = None) -> None:
    """Answer ``r`` (its status, or ``status``) as JSON, and close: no second request on this
    connection. Written here rather than through h11, which cannot answer a head it could not
    parse (its state never reached ``SEND_RESPONSE``)."""
    body = r.http_body()
    code = status if status is not None else r.http_status
    headers = [
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(body))),
        ("Connection", "close"),
    ]
    if code == 407:
        headers.append(("Proxy-Authenticate", CHALLENGE))
    if r.retry_after_s is not None:
        headers.append(("Retry-After", f"{max(1, round(r.retry_after_s))}"))
    try:
        reason = http.HTTPStatus(code).phrase
    except ValueError:
        reason = "Refused"
    head = f"HTTP/1.1 {code} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):  # the client left
        await client.send(head.encode("latin-1") + body)
