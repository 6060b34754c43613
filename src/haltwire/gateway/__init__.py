"""The MCP gateway: level 3 of the stop ladder. ``create_app`` builds it from a config."""

from __future__ import annotations

import time
from contextlib import AsyncExitStack

import anyio
import httpx2

from haltwire import __version__
from haltwire.credentials import JwksKeys
from haltwire.gateway.app import GatewayApp
from haltwire.gateway.ceilings import Ceilings, Clock
from haltwire.gateway.config import GatewayConfig, load_config, parse_config
from haltwire.gateway.credentials import CredentialEdge
from haltwire.gateway.idempotency import Idempotency
from haltwire.gateway.intents import INTENT_TOOL, IntentDesk
from haltwire.gateway.killswitch import SuspensionFile, write_suspensions
from haltwire.gateway.leases import LeaseCheck
from haltwire.gateway.proxy import Gateway
from haltwire.store.counters import CounterStore
from haltwire.store.counters.memory import MemoryCounters
from haltwire.store.counters.redis import RedisCounters
from haltwire.store.idempotency import IdempotencyStore
from haltwire.store.idempotency.memory import MemoryIdempotency
from haltwire.store.idempotency.redis import RedisIdempotency
from haltwire.store.idempotency.sqlite import SqliteIdempotency
from haltwire.upstreams import UpstreamError, Upstreams
from haltwire.watch import ControlUnreachable, StopWatch


def counter_store(config: GatewayConfig) -> CounterStore:
    c = config.counters
    if c.backend == "redis":
        return RedisCounters(c.url, prefix=c.prefix, slot_ttl_s=c.slot_ttl_s, timeout_s=c.timeout_s)
    return MemoryCounters()


def idempotency_store(config: GatewayConfig) -> IdempotencyStore:
    """Idempotency records live where the counters do: in Redis for several gateways; for one,
    in a SQLite file (``[idempotency] path``: they outlive a restart) or in memory."""
    c = config.counters
    if c.backend == "redis":
        return RedisIdempotency(c.url, prefix=c.prefix, timeout_s=c.timeout_s)
    if config.idempotency.path is not None:
        return SqliteIdempotency(config.idempotency.path)
    return MemoryIdempotency()


def create_app(
    config: GatewayConfig, *, clock: Clock = time.time, store: CounterStore | None = None
) -> GatewayApp:
    """The gateway as an ASGI app. Upstreams connect when the app starts (ASGI lifespan)."""
    store = store if store is not None else counter_store(config)
    idempotency = Idempotency(idempotency_store(config), config.idempotency.ttl_s, clock=clock)
    upstreams = Upstreams(config.upstreams)
    stops = StopWatch(config.control) if config.control is not None else None
    # Irreversible calls become intents with [control] (unless [intents] enabled = false).
    intents = IntentDesk(config.control, config.upstreams) if config.intents_on and config.control else None
    leases = None
    if config.leases is not None:
        required = [i.agent for i in config.identities if i.lease == "required"]
        leases = LeaseCheck(config.leases.lease_keys(), required, clock=clock)
    credentials = None
    if config.broker is not None:
        keys = JwksKeys(config.broker.jwks_url, refresh_s=config.broker.refresh_s)
        identities = [i.identity() for i in config.identities]
        credentials = CredentialEdge(keys, config.broker.audience, identities, clock=clock)
    gateway = Gateway(
        upstreams,
        Ceilings(config, store, clock=clock, labels=upstreams.label),
        SuspensionFile(config.gateway.suspended_file),
        stops,
        leases,
        idempotency,
        intents,
    )

    async def startup(stack: AsyncExitStack) -> None:
        stack.push_async_callback(store.aclose)
        stack.push_async_callback(idempotency.store.aclose)
        if intents is not None:
            stack.push_async_callback(intents.aclose)
        if isinstance(idempotency.store, SqliteIdempotency):
            await idempotency.store.connect()  # an unusable path is a start-up error
        if stops is not None:
            # The current stops are held before the first call can arrive.
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)
            await stops.start(tg)
        if credentials is not None:
            try:
                await credentials.keys.fetch()
            except (httpx2.HTTPError, ValueError) as exc:
                raise ControlUnreachable(
                    f"cannot fetch the broker's JWKS at {credentials.keys.url}: {exc}"
                ) from exc
        await upstreams.connect(stack)
        if intents is not None and upstreams.route(INTENT_TOOL) is not None:
            raise UpstreamError(f"an upstream offers {INTENT_TOOL}, the gateway's own tool; give it a prefix")

    return GatewayApp(
        gateway,
        config.token_table(),
        max_body_bytes=config.gateway.max_body_bytes,
        version=__version__,
        on_startup=startup,
        credentials=credentials,
    )


__all__ = [
    "Ceilings",
    "ControlUnreachable",
    "Gateway",
    "GatewayApp",
    "GatewayConfig",
    "StopWatch",
    "SuspensionFile",
    "UpstreamError",
    "counter_store",
    "create_app",
    "idempotency_store",
    "load_config",
    "parse_config",
    "write_suspensions",
]
