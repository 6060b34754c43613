"""What ``benchmarks/gateway.py`` and its modules share: the benchmark's identity and tool, the
variants it measures, and the statistics it gathers for (a), (b) and (c)."""

from __future__ import annotations

from dataclasses import dataclass, field

TOKEN = "tok-bench"
AGENT = "bench-bot"
TOOL = "lookup_order"
#: Every call looks up another order (so the ``repeated_calls`` rule does not trip) and carries
#: an amount (so the money rule counts it); the demo upstream ignores ``amount_cents``.
AMOUNT_CENTS = 5
VARIANTS = [
    "direct",
    "haltwire",
    "haltwire+5tw",
    "haltwire-hs",
    "floor",
    "bare",
    "bare+schema",
    "fastmcp",
    "contextforge",
]
TRIPWIRES = "haltwire+5tw"
#: The variants the lean client measures too: every sessionless one (haltwire-hs is the same
#: gateway as haltwire; ContextForge is compared by latency).
LEAN_VARIANTS = frozenset({"direct", "haltwire", TRIPWIRES, "floor", "bare", "bare+schema", "fastmcp"})
#: The same gateway as "haltwire", called by a session-keeping client (the initialize handshake,
#: protocol 2025-11-25), as the TypeScript SDK 1.x and the MCP Inspector always are.
HANDSHAKE = "haltwire-hs"


@dataclass
class AdmitStats:
    admit_us: list[float]
    both_us: list[float]
    rt_admit: float = float("nan")
    rt_both: float = float("nan")
    wire_admit: float = float("nan")
    wire_both: float = float("nan")


@dataclass
class VariantStats:
    latencies_ms: list[float] = field(default_factory=list)
    rounds_p50: list[float] = field(default_factory=list)
    throughput: list[float] = field(default_factory=list)  # calls/s per round
    calls: int = 0
    upstream_posts: int = 0
    upstream_served: int = 0
    proxy_cpu_s: float = 0.0
    proxy_cpu_calls: int = 0
    client_cpu_s: float = 0.0
    errors: int = 0
    #: The lean client's throughput blocks (``lean_client``): calls/s per round, and the server's
    #: CPU over them (busy, its caches warm: the cost of a call under load).
    lean_throughput: list[float] = field(default_factory=list)
    lean_cpu_s: float = 0.0
    lean_calls: int = 0

