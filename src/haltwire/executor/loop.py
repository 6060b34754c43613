"""The executor: the second step of the two-step pattern for irreversible tools.

The gateway records a call to an irreversible tool as an intent; ``Executor`` carries it out.
For each intent, in this order:

1. claim it (the oldest pending one, never claimed twice);
2. its own lease must hold (``lease.require()``): a stop on the executor, or a control
   plane it cannot reach for ``renew_timeout_s``, ends its lease and it claims nothing more;
3. the final check: the control plane reads the registry
   and either records the revision it checked or cancels the intent with the matching stop.
   Only an intent that passed this check reaches the upstream;
4. the call, through the gateway's upstream for the tool, with the intent's idempotency key in
   ``_meta["io.haltwire/idempotency_key"]``, under the ``irreversible`` label's deadline. A call
   that times out or loses its connection has an unknown outcome: it is re-issued with the same
   key (after ``retry_s``, doubling) until the upstream answers, never with a new key;
5. the outcome recorded: ``commit`` (a result), or ``fail`` (an error result, a JSON-RPC
   error, or no upstream offering the tool). A control plane that cannot be reached is asked
   again until it records it: the outcome is only in this process until then.

Each worker takes one intent through these steps at a time. A worker's outcome (5), its next
claim (1) and that intent's check (3) go to the control plane as one turn, and what the workers
ask at the same moment as one request and one write (``haltwire.executor.batches``, ``POST
/v1/intent-turns``; ``[executor] batch_max``, ``batch_linger_s``), each intent checked and
audited on its own. The claim and the check are one write, the worker performs the call as
soon as the answer comes, and a turn is sent as soon as the one before it is answered, so the
check is as close to the call as a check of its own. Intents held from an earlier lease, and
unknown ones, are checked alone and their outcomes recorded alone (``POST
/v1/intent-batches/check``, ``settle``), batched the same way.

Before anything else, the executor asks the control plane who its token is (``GET
/v1/whoami``) and refuses to run (``WrongRole``) with one that is not sent every stop, as every
enforcement point does (an agent's token sees only the stops that can stop that agent).

Crash safety: on start, ``POST /v1/intents/unknown`` turns every intent this executor's
identity had claimed into ``unknown``; those (and unknown ones left by an earlier start) go
through steps 2 to 5 first. An unknown intent that passed its check is re-issued with its key,
so the upstream answers the outcome it recorded instead of acting twice; one that never passed
it is checked now, and a stop that came meanwhile cancels it.

Cancellation: the executor's tasks belong to ``run``'s task group; cancelling ``run`` (the
process stopping) abandons an intent mid-call, and the next start resolves it as above. When
the lease ends, the executor claims nothing more; a call already under way is carried through
(that stop came after the decision: its revision is above ``checked_revision``), and an intent
checked but not yet called is held for the next lease, its check standing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import anyio
import anyio.abc
from mcp.shared.exceptions import MCPError

from haltwire.errors import describe
from haltwire.executor.batches import Batcher, Tally
from haltwire.executor.client import Answer, Claimed, IntentClient, Settlement
from haltwire.gateway.config import ExecutorSection
from haltwire.meta import KEY_META
from haltwire.metrics import ExecutorMetrics
from haltwire.runtime.client import ControlRefused, ControlUnreachable
from haltwire.runtime.lease import Lease, StopRequested
from haltwire.upstreams import Upstreams, UpstreamUnavailable
from haltwire.watch import EXECUTOR, require_every_stop

log = logging.getLogger("haltwire.executor")

T = TypeVar("T")

#: The longest wait between two attempts at a failed request.
RETRY_MAX_S: Final = 10.0
#: How many settled intents ``Executor.settled`` remembers.
SETTLED_KEPT: Final = 10_000


class ExecutorMisconfigured(Exception):
    """The control plane refuses the executor for good: its token, its role, or no ``[leases]``."""


#: Refusals no retry can mend: the executor stops and says why.
FATAL: Final = frozenset({"unauthenticated", "forbidden", "leases_not_configured", "invalid_request"})


class Executor:
    """Claims, checks, performs and records intents; ``await run()`` until cancelled."""

    def __init__(
        self,
        control: IntentClient,
        upstreams: Upstreams,
        settings: ExecutorSection,
        *,
        deadline_s: float,
    ) -> None:
        self.control = control
        self.upstreams = upstreams
        self.settings = settings
        self.deadline_s = deadline_s
        #: Intents this process holds without an outcome yet (resolved first, in order).
        self._held: list[dict[str, Any]] = []
        #: What ``[executor] metrics_port`` serves.
        self.metrics = ExecutorMetrics()
        #: Where they are served (``run_executor``), if they are.
        self.metrics_url: str | None = None
        #: What happened to the latest intents (``committed``, ``failed``, ``cancelled``), by id:
        #: for demos and tests; the control plane is the record.
        self.settled: dict[str, str] = {}
        most, linger = settings.batch_max, settings.batch_linger_s
        #: The workers' claims, checks and outcomes, each kind sent together (``batches``).
        self.turns: Batcher[Settlement | None, tuple[Answer | None, Claimed | None]] = Batcher(
            self._turn, most=most, linger_s=linger
        )
        #: The claims the turns carried (each turn one request); the checks they carried are
        #: counted with ``checks``' own.
        self.claims = Tally()
        self.checks: Batcher[str, dict[str, Any]] = Batcher(control.check_many, most=most, linger_s=linger)
        self.outcomes: Batcher[Settlement, dict[str, Any]] = Batcher(
            control.settle_many, most=most, linger_s=linger
        )

    # -- the loop ------------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Check the token's role, recover what a crash left, then settle intents for as long as
        the lease holds; when it ends (a stop on the executor), wait and take a new one. Started
        once recovery is asked. ``WrongRole`` for a token that is not sent every stop."""
        try:
            require_every_stop(await self._retrying(self.control.whoami), self.control.url, EXECUTOR)
            self._held = await self._retrying(self._unresolved)
        except ControlRefused as exc:
            raise ExecutorMisconfigured(f"the control plane refused the executor: {exc}") from None
        task_status.started()
        while True:
            try:
                async with Lease.start(self.control, agent_class=self.settings.agent_class) as lease:
                    log.info("executor: lease for run %s", lease.run_id)
                    async with anyio.create_task_group() as tg:
                        for _ in range(self.settings.workers):
                            tg.start_soon(self._work, lease)
                    log.warning("executor: lease ended (%s); claiming nothing", lease.notice)
            except StopRequested as exc:
                log.warning("executor: no lease: %s", exc.notice.message)
            except ControlUnreachable as exc:
                log.warning("executor: control plane unreachable: %s", exc)
            except ControlRefused as exc:
                if exc.code in FATAL:  # an unknown agent class, no [leases]: a configuration to mend
                    raise ExecutorMisconfigured(
                        f"the control plane refused the executor a lease: {exc}"
                    ) from None
                log.error("executor: the control plane refused a lease: %s", exc)
            await anyio.sleep(self.settings.retry_s)

    async def _turn(self, asked: list[Settlement | None]) -> list[tuple[Answer | None, Claimed | None]]:
        """One turn for the workers asking: each one's outcome recorded (if it has one), and an
        intent claimed and checked for each while any is pending."""
        settled, claimed = await self.control.turn([s for s in asked if s is not None], len(asked))
        self.claims.add(len(asked))
        if claimed:
            self.checks.tally.add(len(claimed))
        outcomes, intents = iter(settled), iter(claimed)
        return [(None if s is None else next(outcomes, None), next(intents, None)) for s in asked]

    async def _unresolved(self) -> list[dict[str, Any]]:
        """This identity's intents without an outcome (claimed ones are now unknown)."""
        unknown = await self.control.mark_unknown()
        if unknown:
            log.warning("executor: %d intent(s) with unknown outcome to resolve", len(unknown))
        return unknown

    async def _work(self, lease: Lease) -> None:
        done: Settlement | None = None  # the last call's outcome: recorded with the next turn
        while lease.notice is None:
            if self._held:
                if done is not None:
                    await self._record(done)
                    done = None
                intent = self._held.pop(0)
                if not await self.settle(intent, lease):
                    self._held.append(intent)  # not performed: kept for the next lease
                    return
                continue
            try:
                lease.require()
                recorded, claimed = await self.turns.ask(done)
            except StopRequested:
                break
            except ControlUnreachable as exc:  # the outcome is sent again with the next turn
                log.warning("executor: a turn failed: %s", exc)
                await anyio.sleep(self.settings.retry_s)
                continue
            if done is not None:
                self._recorded(done, recorded)
                done = None
            if claimed is None:
                with anyio.move_on_after(self.settings.poll_s):
                    await lease.ended.wait()
                continue
            self.metrics.intent("claimed")
            intent_id, checked = claimed
            if isinstance(checked, ControlRefused):
                self._refused(intent_id, checked)
                continue
            if lease.notice is not None:
                self._held.append(checked)  # ended while the turn was answered: its check stands
                return
            done = await self._carried_out(checked)
        if done is not None:
            await self._record(done)

    # -- one intent ----------------------------------------------------------------------------

    async def settle(self, intent: dict[str, Any], lease: Lease) -> bool:
        """Check, perform and record one held (unknown, or claimed under an earlier lease)
        intent. False when the lease ended before the call: the intent stays with this executor,
        unperformed (a passed check stands)."""
        intent_id = intent["intent_id"]
        try:
            lease.require()
            checked = await self._retrying(lambda: self.checks.ask(intent_id))
        except StopRequested:
            return False
        except ControlRefused as exc:
            self._refused(intent_id, exc)
            return True
        if lease.notice is not None:
            # Ended while the check was answered: held, checked; the next lease performs it
            # (its check stands: it came before the stop).
            return False
        await self._record(await self._carried_out(checked))
        return True

    def _refused(self, intent_id: str, exc: ControlRefused) -> None:
        """An intent's check refused: cancelled by a stop, or nothing to perform."""
        if exc.code == "stopped":
            log.warning("intent %s cancelled by stop %s: %s", intent_id, exc.error.get("stop_id"), exc)
            self._note(intent_id, "cancelled")
        else:  # settled meanwhile, or not ours: nothing to perform
            log.error("intent %s: the check was refused: %s", intent_id, exc)

    async def _carried_out(self, intent: dict[str, Any]) -> Settlement:
        """The call made (it passed its check just now): what to record of it."""
        outcome, error = await self._perform(intent)
        return Settlement(intent["intent_id"], outcome if error is None else None, error)

    async def _perform(self, intent: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """The upstream's answer: (result, None) to commit, or ({}, error) to fail."""
        route = self.upstreams.route(intent["tool"])
        if route is None:
            return {}, f"no upstream offers the tool {intent['tool']}"
        meta = {KEY_META: intent["idempotency_key"]}
        delay = self.settings.retry_s
        while True:
            try:
                started = time.perf_counter()
                try:
                    with anyio.fail_after(self.deadline_s):
                        result = await route.upstream.call_tool(route.tool, intent["arguments"], meta, None)
                finally:
                    self.metrics.call_duration(time.perf_counter() - started)
            except (TimeoutError, UpstreamUnavailable) as exc:
                # Performed or not, nobody knows: the same key again, never a new one.
                log.warning(
                    "intent %s: outcome unknown (%s); re-issuing with its key",
                    intent["intent_id"],
                    describe(exc),
                )
                await anyio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            except MCPError as exc:
                return {}, f"the upstream answered an error: {exc.message}"
            break
        if result.get("isError"):
            texts = [c.get("text", "") for c in result.get("content", []) if isinstance(c, dict)]
            return {}, " ".join(t for t in texts if t) or "the tool answered an error"
        result.pop("_meta", None)
        return result, None

    async def _record(self, settlement: Settlement) -> None:
        """Record an outcome on its own, asking until the control plane answers."""
        try:
            answer: Answer = await self._retrying(lambda: self.outcomes.ask(settlement))
        except ControlRefused as exc:
            answer = exc
        self._recorded(settlement, answer)

    def _recorded(self, settlement: Settlement, answer: Answer | None) -> None:
        state = "committed" if settlement.error is None else "failed"
        if isinstance(answer, ControlRefused) or answer is None:  # settled by someone else; the call is done
            log.error("intent %s: recording %s was refused: %s", settlement.intent_id, state, answer)
            return
        self._note(settlement.intent_id, state)
        log.info("intent %s %s", settlement.intent_id, state)

    def _note(self, intent_id: str, state: str) -> None:
        self.metrics.intent(state)
        if len(self.settled) >= SETTLED_KEPT:
            del self.settled[next(iter(self.settled))]  # the oldest: dicts keep insertion order
        self.settled[intent_id] = state

    async def _retrying(self, request: Callable[[], Awaitable[T]]) -> T:
        """``await request()`` until the control plane answers (a refusal is an answer)."""
        delay = self.settings.retry_s
        while True:
            try:
                return await request()
            except ControlUnreachable as exc:
                log.warning("executor: control plane unreachable (%s); asking again in %.1f s", exc, delay)
                await anyio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
