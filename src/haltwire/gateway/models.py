"""Model providers on the wire: routing a model name to its ``[[models]]`` entry, forwarding the
request with the provider's key (aiohttp, streamed), and the OpenAI shapes of what the gateway
itself answers (a refusal as an error body, a cut stream's last event).

What is forwarded (``forwarded_headers``): the client's headers but its credentials and the
gateway's (``Authorization``, which becomes the provider's key; ``Haltwire-Lease``; ``Cookie``;
``OpenAI-Organization`` and ``OpenAI-Project``, which would pick another account of the
provider's key), the hop-by-hop ones, and ``Accept-Encoding`` (the gateway asks for an
uncompressed body, so it can read the usage). What comes back (``returned_headers``): the
provider's headers but the hop-by-hop ones, ``Content-Length`` and ``Content-Encoding`` (the
body is relayed decoded) and ``Date`` and ``Server`` (the gateway's own). Bodies and stream
events are relayed byte for byte; ``split_events`` cuts a stream at event boundaries only.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

import aiohttp
import anyio
from yarl import URL

from haltwire.errors import describe
from haltwire.gateway.model_config import ModelRoute
from haltwire.refusal import TRANSIENT_CODES, Refusal
from haltwire.upstreams.sessions import client_session, env_proxy

#: The gateway's model endpoints and the provider path (under its ``base_url``) each goes to.
MODEL_PATHS: Final = {"/v1/chat/completions": "/chat/completions", "/v1/responses": "/responses"}

_HOP_BY_HOP: Final = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"}
)
_NOT_FORWARDED: Final = _HOP_BY_HOP | {
    "authorization",
    "proxy-authorization",
    "haltwire-lease",
    "cookie",
    "openai-organization",
    "openai-project",
    "host",
    "content-length",
    "accept-encoding",
    "expect",
}
_NOT_RETURNED: Final = _HOP_BY_HOP | {
    "proxy-authenticate",
    "content-length",
    "content-encoding",
    "date",
    "server",
}

_NOT_FWD_BYTES: Final = frozenset(h.encode() for h in _NOT_FORWARDED)
_NOT_RET_BYTES: Final = frozenset(h.encode() for h in _NOT_RETURNED)


class ProviderUnavailable(Exception):
    """The provider could not be reached (connection refused, reset, timed out connecting)."""


#: What a failed exchange with a provider raises (``asyncio.TimeoutError`` is an OSError).
PROVIDER_ERRORS: Final = (aiohttp.ClientError, OSError)


class Provider:
    """One ``[[models]]`` entry with its session, opened by the gateway's lifespan (the key is in
    the session's headers only)."""

    def __init__(self, route: ModelRoute, key: str) -> None:
        self.route = route
        self.urls = {path: URL(route.base_url + rest) for path, rest in MODEL_PATHS.items()}
        self.proxy, self.proxy_auth = env_proxy(URL(route.base_url))
        self._key = key
        self._session: aiohttp.ClientSession | None = None

    @property
    def name(self) -> str:
        return self.route.name

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "ModelRoutes.open() runs at start-up"
        return self._session

    def open(self) -> None:
        # No limit on connections: the ceilings' in-flight caps bound them.
        headers = {"authorization": f"Bearer {self._key}"}
        self._session = client_session(limit=0, connect_timeout_s=self.route.connect_timeout_s, headers=headers)

    async def aclose(self) -> None:
        if self._session is not None:
            with anyio.CancelScope(shield=True):  # run as the gateway shuts down, inside a cancelled scope
                await self._session.close()


class ModelRoutes:
    """Model name to provider: exact names first, then the longest prefix."""

    def __init__(self, routes: list[ModelRoute]) -> None:
        """Reads every provider's key: ``ConfigError`` naming the variable when one is unset."""
        self.providers: list[Provider] = []
        self._exact: dict[str, Provider] = {}
        self._prefixes: list[tuple[str, Provider]] = []
        for n, route in enumerate(routes):
            provider = Provider(route, route.api_key(f"models[{n}]"))
            self.providers.append(provider)
            self._exact.update(dict.fromkeys(route.models, provider))
            self._prefixes += [(p, provider) for p in route.prefixes]
        self._prefixes.sort(key=lambda item: -len(item[0]))

    def route(self, model: str) -> tuple[Provider, str] | None:
        """The provider of ``model``, and the name its limits are kept under: the model's own
        when routed by name, ``PREFIX*`` when by a prefix (so names an agent makes up under a
        prefix share one set of counters, not one each)."""
        found = self._exact.get(model)
        if found is not None:
            return found, model
        return next(((p, f"{prefix}*") for prefix, p in self._prefixes if model.startswith(prefix)), None)

    def open(self) -> None:
        """Open the providers' sessions (in the event loop that serves the calls)."""
        for p in self.providers:
            p.open()

    async def aclose(self) -> None:
        for p in self.providers:
            await p.aclose()


def forwarded_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """The client's request headers the provider gets (see the module's docstring)."""
    out = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw if k.lower() not in _NOT_FWD_BYTES]
    out.append(("accept-encoding", "identity"))
    return out


def returned_headers(response: aiohttp.ClientResponse) -> list[tuple[bytes, bytes]]:
    """The provider's response headers the client gets."""
    return [(k, v) for k, v in response.raw_headers if k.lower() not in _NOT_RET_BYTES]


async def open_call(
    provider: Provider, path: str, body: bytes, headers: list[tuple[str, str]]
) -> aiohttp.ClientResponse:
    """Send the request; the response with its body unread (the caller releases or closes it;
    cancelled before the answer's head, aiohttp closes the connection)."""
    try:
        return await provider.session.post(
            provider.urls[path],
            data=body,
            headers=headers,
            allow_redirects=False,
            proxy=provider.proxy,
            proxy_auth=provider.proxy_auth,
        )
    except PROVIDER_ERRORS as exc:
        raise ProviderUnavailable(f"{provider.name}: {describe(exc)}") from exc


# -- what the gateway answers itself, in OpenAI's shapes ----------------------------------------


def error_object(r: Refusal) -> dict[str, Any]:
    """OpenAI's error object (``message``, ``type``, ``param``, ``code``) with haltwire's fields:
    ``code`` is haltwire's, with ``retryable`` and, for a stop, ``scope``, ``stop_id``, ``reason``."""
    kind = "haltwire_refusal" if r.retryable or r.code != "invalid_request" else "invalid_request_error"
    return {"message": r.message, "type": kind, "param": None, **r.error()}


def refusal_response(r: Refusal) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Status, headers and body of a refusal answered to a model call.

    Transient codes keep their status (429, 503) with ``Retry-After``: the OpenAI client waits
    and retries them. Every other refusal says ``x-should-retry: false``, and a terminal one is
    403 (401 unauthenticated): statuses the client does not retry by itself (it retries 408,
    409, 429 and 5xx), so a stop ends the call at its first answer.
    """
    headers = [(b"content-type", b"application/json")]
    if r.code in TRANSIENT_CODES:
        status = r.http_status
        headers.append((b"retry-after", str(max(1, round(r.retry_after_s or 1))).encode()))
    else:
        status = r.http_status if r.http_status in (401, 404, 413, 422) else 403
        headers.append((b"x-should-retry", b"false"))
    if r.code == "unauthenticated":
        headers.append((b"www-authenticate", b'Bearer realm="haltwire"'))
    body = json.dumps({"error": error_object(r)}, separators=(",", ":")).encode()
    return status, headers, body


def error_event(r: Refusal, path: str, sequence_number: int | None) -> bytes:
    """The last event of a stream the gateway ends (a stop cut it): OpenAI's error event for the
    endpoint, carrying the error object, which the OpenAI client raises as an ``APIError``."""
    error = error_object(r)
    if path == "/v1/responses":
        data: dict[str, Any] = {
            "type": "error",
            "code": r.code,
            "message": r.message,
            "param": None,
            "sequence_number": 0 if sequence_number is None else sequence_number + 1,
            "error": error,
        }
        return b"event: error\ndata: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"
    return b"data: " + json.dumps({"error": error}, separators=(",", ":")).encode() + b"\n\n"


# -- server-sent events, byte for byte -------------------------------------------------------------

_LINE_END: Final = re.compile(rb"[\r\n]")


class EventSplitter:
    """Cuts a ``text/event-stream`` into whole events, each the bytes as sent (the blank line that
    ends it included), so an event can be relayed unchanged, or held back. Any line ending the
    format allows (``\\r\\n``, ``\\n``, ``\\r``) is understood."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._scan = 0  # where to look for the next line ending
        self._line = 0  # where the current line starts

    def feed(self, chunk: bytes) -> list[bytes]:
        buf = self._buf
        buf += chunk
        events: list[bytes] = []
        while (m := _LINE_END.search(buf, self._scan)) is not None:
            i = m.start()
            if buf[i] == 0x0D:
                if i + 1 == len(buf):
                    break  # a \r last: a \n may follow in the next chunk
                end = i + 2 if buf[i + 1] == 0x0A else i + 1
            else:
                end = i + 1
            if i == self._line:  # an empty line: the event ends here
                events.append(bytes(buf[:end]))
                del buf[:end]
                self._scan = self._line = 0
            else:
                self._scan = self._line = end
        return events

    def rest(self) -> bytes:
        """What is left when the stream ends (an unfinished event), as it came."""
        rest = bytes(self._buf)
        self._buf.clear()
        self._scan = self._line = 0
        return rest


def event_data(event: bytes) -> tuple[str, str]:
    """An event's name (``message`` when none is given) and its data (lines joined by ``\\n``)."""
    name, data = "message", []
    for line in event.decode("utf-8", "replace").splitlines():
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
    return name, "\n".join(data)
