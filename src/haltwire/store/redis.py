"""What the Redis stores share: the client and its connection pool.

One pool serves a gateway's counters and idempotency records. It is a blocking pool: past
``max_connections`` connections in use, a command waits for one to come back instead of
failing at once (redis-py's default pool raises "Too many connections", which the stores
could only report as Redis being down). The wait is part of the command's deadline: the
stores bound each command, wait included, by their ``timeout_s``.

Sizing: a request to the gateway makes at most one Redis round trip at a time (admit, begin,
complete, release follow each other), so a pool as large as the listener's connection cap
(``[gateway.listener] max_connections``, the gateway's default) never makes a round trip
wait while Redis keeps up. Connections are opened on demand and kept for reuse.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

#: The pool of a store that builds its own client (the gateway passes its listener's cap).
MAX_CONNECTIONS = 1024


def no_maintenance_notifications() -> dict[str, Any]:
    """Client options that turn redis-py's maintenance notifications off, where it has them.

    Recent redis-py turns them on ("auto") over RESP3. With them on, the pool skips its check
    for stale connections before handing one out, so after Redis restarts (or closes idle
    clients) every pooled connection fails one admission; and during maintenance the socket
    timeout is relaxed to 10 s, far past the admission timeout. Checking a connection before
    use is safe (no command was sent on it), unlike retrying a command.
    """
    try:
        from redis.maint_notifications import MaintNotificationsConfig
    except ImportError:  # an older redis-py: nothing to turn off
        return {}
    return {"maint_notifications_config": MaintNotificationsConfig(enabled=False)}


def redis_client(
    url: str, *, timeout_s: float, max_connections: int = MAX_CONNECTIONS, **options: Any
) -> aioredis.Redis:
    """A client on a blocking pool of ``max_connections``; no command is retried by redis-py
    (a retried admission whose reply was lost would count twice). ``options`` go to each
    connection (the benchmark's counting ``connection_class``)."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=timeout_s,  # the stores' own deadline usually ends the wait first
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False,
        **no_maintenance_notifications(),
        **options,
    )
    return aioredis.Redis.from_pool(pool)
