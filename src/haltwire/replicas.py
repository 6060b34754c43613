"""The replicas of one control plane, as a client uses them: one at a time, the next on failure.

Replicas share one registry (PostgreSQL), so revisions are the same on every one of them: a
watcher that moves to another replica resumes from the last revision it applied
(``Last-Event-ID``) and misses nothing. A client keeps using the replica that answered last; a
replica that fails is left for the next one in the list, round and round.

``ReplicaHttp.request`` sends a request that could not even connect to the next replica at once
(nothing was sent, so nothing can be done twice); any other failure (a timeout, a cut
connection, a 5xx) is raised as ``Unreachable``, and the next request goes to the next replica:
whether a cut request took effect is for its caller to find out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx2


class Unreachable(Exception):
    """No replica answered this request; the message says what happened on the last one tried."""


class Replicas:
    def __init__(self, urls: Sequence[str]) -> None:
        if not urls:
            raise ValueError("a control plane needs at least one URL")
        self.urls = tuple(u.rstrip("/") for u in urls)
        self._at = 0

    @property
    def current(self) -> str:
        return self.urls[self._at]

    def failed(self, url: str) -> None:
        """``url`` failed: the next replica becomes current (unless another failure moved on already)."""
        if url == self.current:
            self._at = (self._at + 1) % len(self.urls)

    def round(self) -> list[str]:
        """Every replica once, the current one first."""
        return [*self.urls[self._at :], *self.urls[: self._at]]

    def __len__(self) -> int:
        return len(self.urls)


class ReplicaHttp:
    """An HTTP client for one control plane's replicas, with one bearer token."""

    def __init__(self, urls: str | Sequence[str], token: str, timeout: float | httpx2.Timeout) -> None:
        self.replicas = Replicas([urls] if isinstance(urls, str) else urls)
        self.http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=timeout)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx2.Response:
        """The first answer of a replica that is not a 5xx (501 is an answer: "not offered here")."""
        unreachable: Exception | None = None
        for url in self.replicas.round():
            try:
                r = await self.http.request(method, url + path, **kwargs)
            except (httpx2.ConnectError, httpx2.ConnectTimeout) as exc:
                self.replicas.failed(url)  # not sent: the next replica may take it
                unreachable = exc
                continue
            except httpx2.HTTPError as exc:
                self.replicas.failed(url)
                raise Unreachable(f"{method} {path} at {url}: {type(exc).__name__}: {exc}") from exc
            if r.status_code >= 500 and r.status_code != 501:
                self.replicas.failed(url)
                raise Unreachable(f"{method} {path} at {url}: HTTP {r.status_code}")
            return r
        raise Unreachable(
            f"{method} {path}: no replica could be reached ({type(unreachable).__name__}: {unreachable})"
        ) from unreachable
