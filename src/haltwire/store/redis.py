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

Redis Cluster (``cluster``): redis-py's cluster client, which keeps a pool per master of
``max_connections`` and raises past it instead of waiting (sized as above, a gateway never gets
there). It follows MOVED and ASK replies (a script that was redirected never ran) within the
stores' deadline, and never retries a command that may have run: a connection error, a timeout
or CLUSTERDOWN raises, and the store fails closed. After a failure its map of the slots is made
again in the background (``Cluster``), so once a replica has taken over a lost master's slots the
next calls go to it; and a script a node lacks is given to that node only (``Script``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
from collections.abc import Sequence
from typing import Any, Final, TypeAlias
from urllib.parse import urlsplit

import anyio
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import (
    ClusterDownError,
    MasterDownError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)

log = logging.getLogger("haltwire.store")

#: What the stores talk to: one Redis server, or a cluster.
RedisClient: TypeAlias = aioredis.Redis | RedisCluster
#: What a failed command raises (the cluster client's own errors are no ``RedisError``;
#: a timeout is an ``OSError``).
REDIS_ERRORS = (RedisError, RedisClusterException, OSError)

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
    url: str | Sequence[str],
    *,
    timeout_s: float,
    max_connections: int = MAX_CONNECTIONS,
    cluster: bool = False,
    **options: Any,
) -> RedisClient:
    """A client on a blocking pool of ``max_connections``; no command is retried by redis-py
    (a retried admission whose reply was lost would count twice). ``options`` go to each
    connection (the benchmark's counting ``connection_class``). ``cluster``: a Redis Cluster,
    found from ``url`` (one node's URL, or several: the first that answers tells the rest)."""
    urls = [url] if isinstance(url, str) else list(url)
    if cluster:
        return cluster_client(urls, timeout_s=timeout_s, max_connections=max_connections)
    if len(urls) != 1:
        raise ValueError("several Redis URLs name the nodes of a cluster; set cluster = true")
    pool = aioredis.BlockingConnectionPool.from_url(
        urls[0],
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


class Script:
    """A Lua script, run by its SHA1 (``EVALSHA``) and, on a node that lacks it (``NOSCRIPT``: it
    did not run), by its text (``EVAL``, which leaves it cached there): always on the node its
    keys name. redis-py's ``register_script`` loads a missing script with ``SCRIPT LOAD``, which a
    cluster client sends to every master: while one was down, a script lacking elsewhere (a
    replica just promoted, a restarted master, a cache flushed) could not be given to any node,
    and every call needing it was refused, on the masters that were up too."""

    def __init__(self, client: RedisClient, text: str) -> None:
        self._client: Any = client  # (redis-py types its commands for sync and async clients at once)
        self._text = text
        self.sha = hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()

    async def load(self) -> None:
        """Give the script to the server (on a cluster, to every master)."""
        await self._client.script_load(self._text)

    async def __call__(self, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return await self._client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await self._client.eval(self._text, len(keys), *keys, *args)


async def ready(client: RedisClient) -> None:
    """Before a command: a cluster client maps the slots first (redis-py sends the first command
    of a client without a map to any node, and five MOVED replies at once make it close every
    connection, the other calls' included). No I/O once mapped; call it within the deadline."""
    if isinstance(client, RedisCluster):
        await client.initialize()


#: How long a store's start may spend on ``warm``.
WARM_TIMEOUT_S: Final = 5.0


async def warm(client: RedisClient, scripts: Sequence[Script], what: str) -> None:
    """At a store's start: map a cluster's slots and give every master the store's scripts
    (``SCRIPT LOAD``), so that the first calls pay for neither within their deadlines (a map
    asks the nodes one by one; a node that lacks a script costs a ``NOSCRIPT`` and an ``EVAL``).
    Under the load of a restart in an incident, the first admissions could otherwise be refused
    ``counters_unavailable``. Best effort, within ``WARM_TIMEOUT_S``: a server that does not
    answer now is logged, and the calls then do it themselves, as before (failing closed while
    it does not answer)."""
    try:
        with anyio.fail_after(WARM_TIMEOUT_S):
            await ready(client)
            for script in scripts:
                await script.load()
    except REDIS_ERRORS as exc:  # (TimeoutError is an OSError)
        log.warning(
            "the %s could not give Redis their scripts at start (%s): each call does what is "
            "missing within its own deadline, and is refused while Redis does not answer",
            what,
            str(exc) or type(exc).__name__,
        )


#: Replies that say something of the cluster's state, not of the script.
_CLUSTER_STATE = (ClusterDownError, MasterDownError, TryAgainError)


def failed(client: RedisClient, keys: Sequence[str], exc: BaseException) -> None:
    """After a command on ``keys`` failed (``exc``: an error, or no answer within the deadline):
    on a cluster, map the slots again in the background (``Cluster``). A script's own error
    (a reply: the node answered) is no reason to."""
    if isinstance(exc, ResponseError) and not isinstance(exc, _CLUSTER_STATE):
        return
    if isinstance(client, Cluster):
        client.remap(keys[0] if keys else None)


#: The least time between two maps of the slots made after failures: each one makes every pooled
#: connection reconnect on its next use.
REMAP_EVERY_S = 0.5


class Cluster(RedisCluster):
    """redis-py's cluster client, whose map of the slots, once made, is made again off every
    call's path, in a background task.

    redis-py makes a new map after a connection error, inline: the next command waits for it, and
    the commands behind it wait on its lock. It asks the nodes in a random order, so a node that
    hangs (a host gone without a reset) holds that command to its socket timeout, past the stores'
    deadline; and a map cut off by a deadline closes every connection, the calls' on other masters
    included. Worse, a command cut off by the stores' deadline (a master that hangs) tells redis-py
    nothing: it never maps again, and after a failover it sends the lost master's keys to it
    forever, every call of them refused until the old master is back.

    Here, once a first map is made (inline, within the first command's deadline, as before), a
    new one is asked for by redis-py (after a connection error) or by the stores (``failed``, after
    any failure, a deadline's included), and made in one background task at a time, at most every
    ``REMAP_EVERY_S``, the node that failed asked last. Meanwhile commands go on with the map they
    have: a lost master's keys are refused (fail closed), the others served; the new map serves the
    next command. It asks every node in turn, each within the socket timeout.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._mapped = False
        self._remapping: asyncio.Task[None] | None = None
        self._remapped_at = -math.inf

    async def initialize(
        self,
        additional_startup_nodes_info: list[tuple[str, int]] | None = None,
        last_failed_node_name: str | None = None,
    ) -> RedisCluster:
        if not self._mapped:
            await super().initialize(additional_startup_nodes_info, last_failed_node_name)
            self._mapped = True
        elif self._initialize:  # redis-py asks for a new map: made in the background
            self._initialize = False
            self._remap(last_failed_node_name)
        return self

    def remap(self, key: str | None) -> None:
        """A command on ``key`` failed: map the slots again, its node asked last."""
        node: str | None = None
        if key is not None:
            with contextlib.suppress(RedisClusterException):  # its slot is not mapped
                node = self.nodes_manager.get_node_from_slot(self.keyslot(key)).name
        self._remap(node)

    def _remap(self, failed_node: str | None) -> None:
        if self._mapped and (self._remapping is None or self._remapping.done()):
            self._remapping = asyncio.get_running_loop().create_task(self._map_again(failed_node))

    async def _map_again(self, failed_node: str | None) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, self._remapped_at + REMAP_EVERY_S - loop.time()))
        try:
            await self.nodes_manager.initialize(last_failed_node_name=failed_node)
        except Exception as exc:  # no node answered: the next failure asks again
            log.warning("could not map the Redis Cluster's slots again (%s)", exc)
        finally:
            self._remapped_at = loop.time()

    async def aclose(self) -> None:
        if self._remapping is not None:
            self._remapping.cancel()
            await asyncio.gather(self._remapping, return_exceptions=True)  # its end, not its error
        await super().aclose()


def cluster_client(urls: Sequence[str], *, timeout_s: float, max_connections: int) -> RedisCluster:
    """The cluster client: ``urls`` are startup nodes (credentials and TLS from the first), no
    retries, nodes without slots tolerated (a master that is down takes only its own keys)."""
    nodes = []
    for u in urls:
        parts = urlsplit(u)
        if parts.scheme not in ("redis", "rediss") or not parts.hostname:
            raise ValueError(f"{u!r} is not a redis:// or rediss:// URL of a cluster node")
        if parts.path not in ("", "/", "/0"):
            raise ValueError(f"{u!r} names a database: a Redis Cluster has only database 0")
        nodes.append(ClusterNode(parts.hostname, parts.port or 6379))
    client = Cluster.from_url(
        urls[0],
        startup_nodes=nodes,
        require_full_coverage=False,
        # A MOVED reply patches the map of its slot (the default also closes every connection
        # on each fifth one, failing the calls in flight on them).
        reinitialize_steps=0,
        max_connections=max_connections,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
        **no_maintenance_notifications(),
    )
    return client
