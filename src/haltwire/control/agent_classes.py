"""An agent class's lease timing and time-to-stop target (``[agent_classes.NAME]``).

Checked at start-up, in this order: the lease timing (``ttl_s`` > ``renew_timeout_s`` > 1.2 x
``renew_every_s``), then the target: ``time_to_stop_s`` may not be shorter than ``ttl_s``, since
a runtime whose control plane is unreachable stops only within one lease period (the fail-closed
path); a shorter target is a promise the stack cannot keep.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from haltwire.config import ConfigModel

#: A control-plane rule's mode: ``shadow`` audits what it would have stopped and stops nothing.
RuleMode = Literal["enforce", "shadow", "off"]


class AgentClass(ConfigModel):
    """Lease timing for one class of agent (``[agent_classes.NAME]``).

    Checked like Kubernetes leader election: ``ttl_s`` > ``renew_timeout_s`` >
    1.2 x ``renew_every_s``. The runtime renews every ``renew_every_s``; if it has not
    renewed within ``renew_timeout_s`` of its last grant it gives up (the run stops) before
    the gateway's own ``ttl_s`` bound does it.
    """

    ttl_s: float = Field(default=15.0, gt=0)
    renew_every_s: float = Field(default=5.0, gt=0)
    renew_timeout_s: float = Field(default=10.0, gt=0)
    #: The target: no side effect of a run of this class later than this after a stop
    #: (``haltwire drill`` judges it); at least ``ttl_s``. None: no target.
    time_to_stop_s: float | None = Field(default=None, gt=0)
    #: The wall-clock budget: a run of this class older than this (since it registered) is
    #: stopped (``haltwire.control.wall_clock``); None: no bound.
    max_wall_clock_s: float | None = Field(default=None, gt=0)
    wall_clock_mode: RuleMode = "enforce"

    @model_validator(mode="after")
    def _ordered(self) -> AgentClass:
        if not self.ttl_s > self.renew_timeout_s:
            raise ValueError(f"ttl_s ({self.ttl_s:g}) must exceed renew_timeout_s ({self.renew_timeout_s:g})")
        if not self.renew_timeout_s > 1.2 * self.renew_every_s:
            raise ValueError(
                f"renew_timeout_s ({self.renew_timeout_s:g}) must exceed 1.2 x renew_every_s "
                f"({1.2 * self.renew_every_s:g})"
            )
        if self.time_to_stop_s is not None and self.time_to_stop_s < self.ttl_s:
            raise ValueError(
                f"time_to_stop_s ({self.time_to_stop_s:g}) is shorter than ttl_s ({self.ttl_s:g}): a run "
                "whose control plane is unreachable stops only within one lease period, so the target "
                f"must be at least {self.ttl_s:g} s"
            )
        return self
