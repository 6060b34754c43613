"""The aiohttp client sessions of the gateway's two outgoing legs: MCP upstreams
(``haltwire.upstreams.http``) and model providers (``haltwire.gateway.models``).

aiohttp, not httpx2: about 0.5 ms of CPU per request against about 2 ms here
(``benchmarks/gateway.py``, ``benchmarks/models.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Final

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

#: An idle connection is dropped after this long: before servers drop it (uvicorn: 5 s), so
#: a POST is not sent on a connection the server is closing (POSTs are never retried).
KEEPALIVE_S: Final = 4.0


def client_session(
    *, limit: int, connect_timeout_s: float, headers: Mapping[str, str] | None = None
) -> aiohttp.ClientSession:
    """A session for one destination: ``limit`` connections at once (0: no limit), kept alive
    ``KEEPALIVE_S``; connecting (or waiting for a pooled connection) bounded by
    ``connect_timeout_s``, the rest by the call's own deadline. Create it in the event loop
    that uses it."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, keepalive_timeout=KEEPALIVE_S),
        timeout=aiohttp.ClientTimeout(total=None, connect=connect_timeout_s),
        headers=headers,
        # Calls of every identity share the session: no cookie of one goes out with another's.
        cookie_jar=aiohttp.DummyCookieJar(),
    )


def env_proxy(url: URL) -> tuple[URL | None, aiohttp.BasicAuth | None]:
    """The environment's proxy for ``url`` (HTTP_PROXY, NO_PROXY, ...), read once, as aiohttp
    reads it: its ``trust_env`` reads it and ``~/.netrc`` in a thread on every request (+1.2 ms
    of CPU per call), and a netrc entry next to an Authorization header fails the request."""
    with contextlib.suppress(LookupError):
        return get_env_proxy_for_url(url)
    return None, None
