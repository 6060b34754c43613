"""The egress proxy process: the watch, the listener, and the guard that fails closed.

``EgressProxy.run`` owns, in one task group for the proxy's lifetime:

1. the ``StopWatch`` following the control plane (started first: the proxy accepts connections
   only once it holds the stops issued before it started; the socket is bound beforehand, so a
   connection made meanwhile waits in its backlog);
2. the staleness guard: every ``stale_check_s`` it looks at whether the watch is current; the
   first time it is not, every open connection is closed (``OpenConnections.cut_all``) and every
   new request is refused ``registry_unreachable`` until the watch hears again. So a tunnel
   outlives a lost control plane by at most ``staleness_s + stale_check_s``;
3. the listener: a task per client connection (``Proxy.handle``), owned by the listener's task
   group; past ``max_connections`` open ones, a new connection is closed as it is accepted.

Cancelling ``run`` (SIGINT/SIGTERM in ``haltwire egress``) cancels all three, closing every
connection. With ``[egress] metrics_port``, ``/metrics`` is served on a listener of its own.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from contextlib import AsyncExitStack

import anyio
import anyio.abc
import httpx2

from haltwire.credentials import JwksKeys
from haltwire.egress.auth import Broker
from haltwire.egress.config import EgressConfig
from haltwire.egress.connections import OpenConnections
from haltwire.egress.proxy import Proxy
from haltwire.metrics_http import metrics_app
from haltwire.serve import serving
from haltwire.watch import EGRESS, StopWatch

log = logging.getLogger("haltwire.egress")


class EgressProxy:
    def __init__(self, config: EgressConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.watch = StopWatch(config.control, point=EGRESS, clock=clock)
        self.connections = OpenConnections(self.watch, clock=clock)
        broker = config.broker
        self.broker = (
            None
            if broker is None
            else Broker(JwksKeys(broker.jwks_url, refresh_s=broker.refresh_s), broker.audience)
        )
        self.proxy = Proxy(
            config.egress, config.leases.lease_keys(), self.connections, broker=self.broker, clock=clock
        )
        #: Client connections open now (the cap's count).
        self.clients = 0
        #: Where ``/metrics`` is served (``[egress] metrics_port``), once it is.
        self.metrics_url: str | None = None

    async def run(
        self, sock: socket.socket, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve on ``sock`` (bound beforehand: ``haltwire.serve.listen``) until cancelled; reports
        started, with the port it listens on, once its stops are current."""
        section = self.config.egress
        async with anyio.create_task_group() as tg, AsyncExitStack() as stack:
            if section.metrics_port is not None:
                app = metrics_app(self.proxy.metrics.registry)
                served = serving(app, section.metrics_host, section.metrics_port, lifespan="off")
                self.metrics_url = await stack.enter_async_context(served) + "/metrics"
            await self.watch.start(tg)
            if self.broker is not None:
                try:
                    await self.broker.keys.fetch()
                except (httpx2.HTTPError, ValueError) as exc:
                    # Not fatal: lease tokens are served meanwhile, and credentials are refused
                    # until the keys can be fetched (an unknown key id fetches them again).
                    log.warning("cannot fetch the broker's JWKS at %s: %s", self.broker.keys.url, exc)
            tg.start_soon(self._guard)
            listener = await anyio.abc.SocketListener.from_socket(sock)
            task_status.started(listener.extra(anyio.abc.SocketAttribute.local_port))
            async with listener:
                await listener.serve(self._accept)

    async def _accept(self, client: anyio.abc.SocketStream) -> None:
        if self.clients >= self.config.egress.max_connections:
            await client.aclose()  # no answer: answering would cost what the cap protects
            return
        self.clients += 1
        try:
            await self.proxy.handle(client)
        except Exception:
            # One connection's failure must not end the listener (and every other connection).
            log.exception("egress connection failed")
        finally:
            self.clients -= 1

    async def _guard(self) -> None:
        stale = False
        while True:
            await anyio.sleep(self.config.egress.stale_check_s)
            if self.watch.current():
                stale = False
                continue
            if not stale:
                cut = self.connections.cut_all("stale watch")
                log.error(
                    "the watch has heard nothing for over %g s: %d connections closed, every request refused",
                    self.config.control.staleness_s,
                    cut,
                )
            stale = True
