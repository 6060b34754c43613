"""The executor (``haltwire executor``): commits the intents of irreversible tools (two-step).

``run_executor(config)`` connects the gateway config's upstreams, takes a lease as the
``[executor]`` identity and settles intents until cancelled; ``Executor`` is the loop itself
(``haltwire.executor.loop`` explains each step and what a crash leaves). With
``[executor] metrics_port``, its ``/metrics`` is served on a listener of its own.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

import anyio
import anyio.abc

from haltwire.errors import unwrapped
from haltwire.executor.client import IntentClient
from haltwire.executor.loop import Executor, ExecutorMisconfigured
from haltwire.gateway.config import GatewayConfig
from haltwire.metrics_http import metrics_app
from haltwire.serve import serving
from haltwire.upstreams import UpstreamError, Upstreams
from haltwire.watch import WrongRole

__all__ = ["Executor", "ExecutorMisconfigured", "IntentClient", "UpstreamError", "WrongRole", "run_executor"]


async def run_executor(
    config: GatewayConfig, *, task_status: anyio.abc.TaskStatus[Executor] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Run the executor of ``config`` (which needs ``[control]`` and ``[executor]``) until cancelled.

    ``UpstreamError`` when an upstream does not start; ``ConfigError`` for an unset token
    variable; ``ExecutorMisconfigured`` when the control plane refuses it for good (an unknown
    token, a role other than executor, no ``[leases]``, an unknown agent class); ``WrongRole`` for
    a token the control plane does not send every stop. ``task_status`` reports the executor once
    its upstreams are connected and its crash recovery has been asked of the control plane.
    """
    if config.control is None or config.executor is None:
        raise ValueError("the executor needs [control] and [executor] in the config")
    token = config.executor.resolve_token()
    with unwrapped():  # an upstream that does not start comes out as UpstreamError, not a group
        async with AsyncExitStack() as stack:
            upstreams = Upstreams(config.upstreams)
            await upstreams.connect(stack)
            control = await stack.enter_async_context(IntentClient(config.control.urls, token))
            executor = Executor(
                control, upstreams, config.executor, deadline_s=config.labels.irreversible_deadline_s
            )
            settings = config.executor
            if settings.metrics_port is not None:
                try:
                    served = serving(
                        metrics_app(executor.metrics.registry), settings.metrics_host, settings.metrics_port,
                        lifespan="off",
                    )  # fmt: skip
                    executor.metrics_url = await stack.enter_async_context(served) + "/metrics"
                except OSError as exc:
                    raise ExecutorMisconfigured(
                        f"cannot serve metrics on {settings.metrics_host}:{settings.metrics_port}: {exc.strerror or exc}"
                    ) from None
            async with anyio.create_task_group() as tg:
                await tg.start(executor.run)
                task_status.started(executor)
