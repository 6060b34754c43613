"""The MCP gateway: level 3 of the stop ladder. ``create_app`` builds it from a config."""

from __future__ import annotations

import logging
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
from haltwire.gateway.hosts import HostCheck
from haltwire.gateway.idempotency import Idempotency
from haltwire.gateway.identities import Identities
from haltwire.gateway.inflight import InFlight
from haltwire.gateway.intents import INTENT_TOOL, IntentDesk
from haltwire.gateway.issuer import IssuerEdge, KeysUnavailable
from haltwire.gateway.killswitch import SuspensionFile, write_suspensions
from haltwire.gateway.leases import LeaseCheck
from haltwire.gateway.model_calls import ModelCalls
from haltwire.gateway.models import ModelRoutes
from haltwire.gateway.outcomes import CallReports
from haltwire.gateway.proxy import Gateway
from haltwire.gateway.usage import UsageCounts
from haltwire.store.counters import CounterStore
from haltwire.store.counters.memory import MemoryCounters
from haltwire.store.counters.redis import RedisCounters
from haltwire.store.idempotency import IdempotencyStore
from haltwire.store.idempotency.memory import MemoryIdempotency
from haltwire.store.idempotency.redis import RedisIdempotency
from haltwire.store.idempotency.sqlite import SqliteIdempotency
from haltwire.store.redis import RedisClient, redis_client
from haltwire.tripwires.calllog import CallLog, recording
from haltwire.tripwires.engine import Tripwires
from haltwire.tripwires.plan import RUN_TTL_S
from haltwire.tripwires.writer import StopWriter
from haltwire.upstreams import UpstreamError, Upstreams
from haltwire.watch import ControlUnreachable, StopWatch, WrongRole

log = logging.getLogger("haltwire.gateway")


def redis_pool_size(config: GatewayConfig) -> int:
    """``[counters] max_connections``, by default the listener's connection cap: a request makes
    one Redis round trip at a time, so no round trip then waits for a pooled connection."""
    return config.counters.max_connections or config.gateway.listener.max_connections


def shared_redis(config: GatewayConfig) -> RedisClient | None:
    """The one Redis client (and pool) of the counters and the idempotency records, if in Redis."""
    c = config.counters
    if c.backend != "redis":
        return None
    return redis_client(c.url, timeout_s=c.timeout_s, max_connections=redis_pool_size(config), cluster=c.cluster)


def counter_store(config: GatewayConfig, client: RedisClient | None = None) -> CounterStore:
    c = config.counters
    if c.backend == "redis":
        return RedisCounters(
            c.url,
            prefix=c.prefix,
            slot_ttl_s=c.slot_ttl_s,
            timeout_s=c.timeout_s,
            max_connections=redis_pool_size(config),
            cluster=c.cluster,
            client=client,
        )
    return MemoryCounters()


def idempotency_store(config: GatewayConfig, client: RedisClient | None = None) -> IdempotencyStore:
    """Idempotency records live where the counters do: in Redis for several gateways; for one,
    in a SQLite file (``[idempotency] path``: they outlive a restart) or in memory."""
    c = config.counters
    if c.backend == "redis":
        return RedisIdempotency(
            c.url,
            prefix=c.prefix,
            timeout_s=c.timeout_s,
            max_connections=redis_pool_size(config),
            retry_for_s=config.idempotency.ttl_s,
            cluster=c.cluster,
            client=client,
        )
    if config.idempotency.path is not None:
        return SqliteIdempotency(config.idempotency.path)
    return MemoryIdempotency()


def tripwires_of(
    config: GatewayConfig, store: CounterStore, stops: StopWatch | None, upstreams: Upstreams, clock: Clock
) -> tuple[Tripwires | None, StopWriter | None]:
    """The per-call tripwires (None when no rule is on) and the writer of their stops."""
    if all(r.mode == "off" for r in config.tripwires):
        return None, None
    link = config.tripwire_stops
    writer = StopWriter(link.urls(config.control), link.resolve_token()) if link is not None else None
    revision = (lambda: stops.revision) if stops is not None else None
    hold_s = None
    if config.counters.backend == "redis":
        # Every gateway refuses a trip judged on an outcome until its stop can have reached it
        # (twice the staleness bound: past it, a gateway that heard nothing refuses everything).
        hold_s = 2 * config.control.staleness_s if config.control is not None else RUN_TTL_S
    tripwires = Tripwires(
        config.tripwires,
        store,
        writer=writer,
        watch_revision=revision,
        clock=clock,
        labels=upstreams.label,
        hold_s=hold_s,
    )
    return tripwires, writer


def create_app(
    config: GatewayConfig, *, clock: Clock = time.time, store: CounterStore | None = None
) -> GatewayApp:
    """The gateway as an ASGI app. Upstreams connect when the app starts (ASGI lifespan)."""
    shared = shared_redis(config)
    store = store if store is not None else counter_store(config, shared)
    idempotency = Idempotency(idempotency_store(config, shared), config.idempotency.ttl_s, clock=clock)
    upstreams = Upstreams(config.upstreams)
    stops = StopWatch(config.control) if config.control is not None else None
    # With [control], new stops reach calls in flight, and their outcomes go to the run report.
    reports = CallReports(config.control) if config.control is not None else None
    inflight = InFlight(stops, reports, clock=clock) if stops is not None else None
    # Irreversible calls become intents with [control] (unless [intents] enabled = false).
    intents = IntentDesk(config.control, config.upstreams) if config.intents_on and config.control else None
    leases = None
    if config.leases is not None:
        # The identities that opted out of leases; with an [issuer], its own opt-out.
        issued_optional = config.issuer is not None and config.issuer.lease == "optional"
        leases = LeaseCheck(
            config.leases.lease_keys(), config.lease_optional(), clock=clock, issued_optional=issued_optional
        )
    credentials = None
    if config.broker is not None:
        keys = JwksKeys(config.broker.jwks_url, refresh_s=config.broker.refresh_s)
        identities = [i.identity() for i in config.identities]
        credentials = CredentialEdge(keys, config.broker.audience, identities, clock=clock)
    issuer = IssuerEdge(config.issuer, clock=clock) if config.issuer is not None else None
    call_log = None
    if config.call_log is not None:
        paths = [r.amount for r in config.tripwires if r.amount is not None]
        call_log = CallLog(config.call_log, paths, clock)
    # With a call log, the times the tripwires read are recorded, for a backtest to replay.
    tripwires, writer = tripwires_of(config, store, stops, upstreams, recording(clock) if call_log else clock)
    gateway = Gateway(
        upstreams,
        Ceilings(config, store, clock=clock, labels=upstreams.label),
        SuspensionFile(config.gateway.suspended_file),
        stops,
        leases,
        idempotency,
        intents,
        inflight,
        tripwires,
        call_log,
    )
    # [[models]]: the model endpoints; every provider's key is read here (unset: a start-up error).
    routes = ModelRoutes(config.models) if config.models else None
    models = None
    if routes is not None:
        models = ModelCalls(gateway, routes, UsageCounts(store, config.limits.window_s, clock=clock), reports)

    async def startup(stack: AsyncExitStack) -> None:
        if routes is not None:
            routes.open()  # aiohttp's sessions belong to the serving loop
            stack.push_async_callback(routes.aclose)
        if shared is not None:
            stack.push_async_callback(shared.aclose)  # after both stores close
        stack.push_async_callback(store.aclose)
        stack.push_async_callback(idempotency.store.aclose)
        # The stores' retries (of releases, of outcome records) live as long as the gateway.
        retries = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(retries.cancel_scope.cancel)
        await store.start(retries)
        await idempotency.store.start(retries)
        if call_log is not None:
            stack.push_async_callback(call_log.aclose)  # the last records, written at shutdown
            await retries.start(call_log.run)  # an unwritable path is a start-up error
        if writer is not None:
            # Owned by the same group: cancelled at shutdown, logging any stop not yet written.
            stack.push_async_callback(writer.aclose)
            await writer.check()  # a token the control plane knows by another role: a start-up error
            await retries.start(writer.run)
        if intents is not None:
            stack.push_async_callback(intents.aclose)
        if reports is not None:
            stack.push_async_callback(reports.aclose)
        if isinstance(idempotency.store, SqliteIdempotency):
            await idempotency.store.connect()  # an unusable path is a start-up error
        if stops is not None:
            # The current stops are held before the first call can arrive.
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)
            if reports is not None:
                await tg.start(reports.run)  # owned by this group: cancelled at shutdown
            await stops.start(tg)
        if credentials is not None:
            try:
                await credentials.keys.fetch()
            except (httpx2.HTTPError, ValueError) as exc:
                raise ControlUnreachable(
                    f"cannot fetch the broker's JWKS at {credentials.keys.url}: {exc}"
                ) from exc
        if issuer is not None:
            try:
                await issuer.keys.fetch()
            except KeysUnavailable as exc:
                # Not a start-up error: the token table's identities are served meanwhile, and the
                # issuer's tokens are refused until its keys can be fetched (fail closed).
                log.warning("%s; its tokens are refused until they can be fetched", exc)
        await upstreams.connect(stack)
        if intents is not None and upstreams.route(INTENT_TOOL) is not None:
            raise UpstreamError(f"an upstream offers {INTENT_TOOL}, the gateway's own tool; give it a prefix")

    return GatewayApp(
        gateway,
        Identities(config.token_table(), issuer=issuer, credentials=credentials),
        max_body_bytes=config.gateway.max_body_bytes,
        version=__version__,
        on_startup=startup,
        hosts=HostCheck(config.gateway.allowed_hosts, config.gateway.allowed_origins, config.gateway.host),
        models=models,
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
    "WrongRole",
    "counter_store",
    "create_app",
    "idempotency_store",
    "load_config",
    "parse_config",
    "redis_pool_size",
    "write_suspensions",
]
