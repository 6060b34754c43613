"""The report of ``benchmarks/gateway.py``: sections (a), (b) and (c) as printed, the five rules'
cost, and the targets each section checks (issue 18's among them)."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import tripwires as rule_cost
from gateway_common import HANDSHAKE, TOOL, TRIPWIRES, AdmitStats, VariantStats
from procs import pct

#: A session-keeping client's calls take the fast path too: about the CPU of a sessionless one's.
MAX_HANDSHAKE_CPU_RATIO = 1.25
#: The target: the five rules cost at most this much of haltwire's p50 without them.
MAX_TRIPWIRE_RATIO = 1.10
#: Issue 18's targets: haltwire's p50 over direct's, for sessionless and session-keeping
#: clients; the gateway's CPU per call (ms) with the default config and with five rules; and
#: against the rivals, p50 at most this share of theirs and FastMCP's throughput this many times.
MAX_DIRECT_RATIO = 1.20
MAX_CPU_MS = 0.40
MAX_CPU_MS_TRIPWIRES = 0.50
MAX_FASTMCP_P50_SHARE = 0.5
MIN_FASTMCP_TPUT_RATIO = 2.0
MAX_CONTEXTFORGE_P50_SHARE = 0.1


def report_admission(mem: AdmitStats, red: AdmitStats | str, redis_url: str) -> list[tuple[str, bool | None]]:
    print("(a) in-memory admission decision (Ceilings.admit + Ticket.release on MemoryCounters)")
    print(f"    iterations: {len(mem.both_us)}")
    print(
        f"    admit:           p50 {pct(mem.admit_us, 0.5):7.2f} µs   p99 {pct(mem.admit_us, 0.99):7.2f} µs"
    )
    print(f"    admit + release: p50 {pct(mem.both_us, 0.5):7.2f} µs   p99 {pct(mem.both_us, 0.99):7.2f} µs")
    print()
    print(f"(b) Redis admission decision (RedisCounters, {redis_url}, unique prefix, keys deleted after)")
    if isinstance(red, str):
        print(f"    {red}")
    else:
        print(f"    iterations: {len(red.both_us)}")
        print(
            f"    admit:           p50 {pct(red.admit_us, 0.5):7.1f} µs   p99 {pct(red.admit_us, 0.99):7.1f} µs"
        )
        print(
            f"    admit + release: p50 {pct(red.both_us, 0.5):7.1f} µs   p99 {pct(red.both_us, 0.99):7.1f} µs"
        )
        print(
            f"    round trips per admission: {red.rt_admit:.2f} (round_trips counter), "
            f"{red.wire_admit:.2f} (commands written to the socket)"
        )
        print(
            f"    round trips per admit+release: {red.rt_both:.2f} (round_trips counter), "
            f"{red.wire_both:.2f} (commands written to the socket)"
        )
    print()
    return [("in-memory admission p99 < 50 µs", pct(mem.both_us, 0.99) < 50.0)]


def report_rule_cost(costs: dict[str, tuple[list[float], list[float]]], redis_url: str) -> None:
    names = ", ".join(str(r["name"]) for r in rule_cost.FIVE)
    print(f"    the five tripwires' rules ({names}) per call, benchmarks/tripwires.py's measurement")
    print("    (plan + admit + judge + release + settle, against the same without rules):")
    for kind, (none, five) in costs.items():
        us = [1e6 * x for x in none], [1e6 * x for x in five]
        print(
            f"      {kind:<6} without p50 {pct(us[0], 0.5):7.1f} µs  p99 {pct(us[0], 0.99):7.1f} µs;  "
            f"with five p50 {pct(us[1], 0.5):7.1f} µs  p99 {pct(us[1], 0.99):7.1f} µs;  "
            f"the rules: p50 +{pct(us[1], 0.5) - pct(us[0], 0.5):.1f} µs"
        )
    if "redis" not in costs:
        print(f"      redis  skipped: Redis at {redis_url} does not answer")
    print()


def cpu_ms(s: VariantStats) -> float:
    """The CPU (ms, user+system) per call of the process the client talked to."""
    return 1000 * s.proxy_cpu_s / s.proxy_cpu_calls if s.proxy_cpu_calls else float("nan")


def issue18_checks(
    stats: dict[str, VariantStats], p50: dict[str, float], tput: dict[str, float]
) -> list[tuple[str, bool | None]]:
    """Issue 18's acceptance, for the variants this run measured."""
    checks: list[tuple[str, bool | None]] = []
    if "direct" in stats:
        for v, who in (("haltwire", "sessionless"), (HANDSHAKE, "session-keeping")):
            if v in stats:
                ratio = p50[v] / p50["direct"]
                checks.append(
                    (
                        f"{v} p50 <= {MAX_DIRECT_RATIO:.2f}x direct ({who}): {ratio:.2f}x",
                        ratio <= MAX_DIRECT_RATIO,
                    )
                )
    for v, most in (("haltwire", MAX_CPU_MS), (TRIPWIRES, MAX_CPU_MS_TRIPWIRES)):
        if v in stats:
            ms = cpu_ms(stats[v])
            checks.append((f"{v} gateway CPU per call <= {most:.2f} ms: {ms:.2f} ms", ms <= most))
            s = stats[v]
            if s.lean_calls and s.lean_cpu_s:  # the same bound, busy (the lean client's blocks)
                loaded = 1000 * s.lean_cpu_s / s.lean_calls
                checks.append((f"{v} gateway CPU per call <= {most:.2f} ms, loaded: {loaded:.2f} ms", loaded <= most))
    if "fastmcp" in stats:
        share, times = p50["haltwire"] / p50["fastmcp"], tput["haltwire"] / tput["fastmcp"]
        checks.append(
            (
                f"haltwire p50 <= {MAX_FASTMCP_P50_SHARE}x fastmcp's: {share:.2f}x",
                share <= MAX_FASTMCP_P50_SHARE,
            )
        )
        checks.append(
            (
                f"haltwire calls/s >= {MIN_FASTMCP_TPUT_RATIO:.0f}x fastmcp's: {times:.2f}x",
                times >= MIN_FASTMCP_TPUT_RATIO,
            )
        )
        h, f = stats["haltwire"].lean_throughput, stats["fastmcp"].lean_throughput
        if h and f:
            lean = statistics.median(h) / statistics.median(f)
            checks.append(
                (
                    f"haltwire calls/s >= {MIN_FASTMCP_TPUT_RATIO:.0f}x fastmcp's, lean client: {lean:.2f}x",
                    lean >= MIN_FASTMCP_TPUT_RATIO,
                )
            )
    if "contextforge" in stats:
        share = p50["haltwire"] / p50["contextforge"]
        checks.append(
            (
                f"haltwire p50 <= {MAX_CONTEXTFORGE_P50_SHARE}x contextforge's: {share:.3f}x",
                share <= MAX_CONTEXTFORGE_P50_SHARE,
            )
        )
    return checks


def report_calls(
    stats: dict[str, VariantStats], opts: argparse.Namespace, info: dict[str, Any]
) -> list[tuple[str, bool | None]]:
    print(
        f"(c) tools/call {TOOL} on loopback, official mcp.Client (streamable HTTP, httpx2, cache=None); "
        f"{opts.rounds} rounds, interleaved; per round and variant: {opts.calls} sequential calls "
        f"(latency), then {opts.tput_calls} calls by {opts.concurrency} concurrent tasks (throughput)"
    )
    p50 = {v: pct(s.latencies_ms, 0.5) for v, s in stats.items()}
    p99 = {v: pct(s.latencies_ms, 0.99) for v, s in stats.items()}
    tput = {v: statistics.median(s.throughput) for v, s in stats.items()}
    direct = "direct" if "direct" in stats else None
    header = (
        f"    {'variant':<12} {'p50 ms':>8} {'p99 ms':>8} {'calls/s':>8} {'p50/direct':>10} "
        f"{'tput/direct':>11} {'server CPU':>10} {'client CPU':>10} {'lean calls/s':>12} {'loaded CPU':>10} "
        f"{'upstream req/call':>17} {'spread p50':>13}"
    )
    print(header)
    print("    " + "-" * (len(header) - 4))
    for v, s in stats.items():
        r_lat = f"{p50[v] / p50[direct]:.2f}x" if direct else "-"
        r_tp = f"{tput[v] / tput[direct]:.2f}x" if direct else "-"
        cpu = f"{1000 * s.proxy_cpu_s / s.proxy_cpu_calls:.2f}" if s.proxy_cpu_calls else "-"
        client_cpu = f"{1000 * s.client_cpu_s / s.proxy_cpu_calls:.2f}" if s.proxy_cpu_calls else "-"
        per_call = f"{s.upstream_posts / s.calls:.3f}" if s.calls else "-"
        spread = f"{min(s.rounds_p50):.2f}-{max(s.rounds_p50):.2f}"
        lean = f"{statistics.median(s.lean_throughput):.0f}" if s.lean_throughput else "-"
        loaded = f"{1000 * s.lean_cpu_s / s.lean_calls:.2f}" if s.lean_calls and s.lean_cpu_s else "-"
        print(
            f"    {v:<12} {p50[v]:>8.2f} {p99[v]:>8.2f} {tput[v]:>8.0f} {r_lat:>10} {r_tp:>11} "
            f"{cpu:>10} {client_cpu:>10} {lean:>12} {loaded:>10} {per_call:>17} {spread:>13}"
        )
    for v, why in info.get("skipped", {}).items():
        print(f"    {v:<14} skipped: {why}")
    print(
        "    calls/s: median over rounds. server CPU: user+system ms per call of the process the client "
        "talks to (the upstream for direct, else the proxy), client CPU: of this process, both over the "
        "latency blocks. spread: lowest and highest per-round p50.\n"
        f"    lean calls/s: the same {opts.tput_calls} calls per round by {opts.concurrency} tasks as raw JSON-RPC "
        "POSTs over kept-alive aiohttp connections (benchmarks/lean_client.py), median over rounds: the "
        "official client's calls/s stop where its own CPU does. loaded CPU: the server's CPU per call "
        "over those blocks (busy, caches warm)."
    )
    by_method = {
        k.removeprefix("POST "): v
        for k, v in info.get("upstream_requests", {}).items()
        if k.startswith("POST ")
    }
    print(f"    upstream HTTP POSTs over the whole run (start-ups included), by Mcp-Method: {by_method}")
    errors = {v: s.errors for v, s in stats.items() if s.errors}
    if errors:
        print(f"    ERRORS (unexpected results): {errors}")
    checks: list[tuple[str, bool | None]] = []
    if "haltwire" in stats:
        h = stats["haltwire"]
        print()
        print("    haltwire against the others:")
        for v in stats:
            if v == "haltwire":
                continue
            print(
                f"      vs {v:<12} p50 {p50['haltwire'] / p50[v]:.2f}x   p99 {p99['haltwire'] / p99[v]:.2f}x   "
                f"calls/s {tput['haltwire'] / tput[v]:.2f}x"
            )
        if "floor" in stats and direct:
            f = stats["floor"]
            f_cpu, h_cpu = f.proxy_cpu_s / f.proxy_cpu_calls, h.proxy_cpu_s / h.proxy_cpu_calls
            print()
            print(
                f"    the floor (the least a Python gateway does per call: benchmarks/floor.py): p50 "
                f"{p50['floor'] / p50[direct]:.2f}x direct, CPU {1000 * f_cpu:.2f} ms per call; haltwire "
                f"over it: p50 {p50['haltwire'] / p50['floor']:.2f}x, CPU {h_cpu / f_cpu:.2f}x "
                f"(+{1000 * (h_cpu - f_cpu):.2f} ms per call: ASGI, the pipeline's checks, its coroutines)"
            )
        print()
        print(
            f"    upstream requests per tools/call through haltwire: {h.upstream_posts}/{h.calls} = "
            f"{h.upstream_posts / h.calls:.3f} HTTP POSTs (tool calls served: {h.upstream_served})"
        )
        checks.append(
            ("exactly one upstream request per tools/call", h.upstream_posts == h.calls == h.upstream_served)
        )
        for bare in ("bare", "bare+schema"):
            if bare in stats:
                checks.append((f"haltwire p50 <= {bare} p50", p50["haltwire"] <= p50[bare]))
        checks += issue18_checks(stats, p50, tput)
        if errors:
            checks.append(("every call answered correctly", False))
    if "haltwire" in stats and HANDSHAKE in stats:
        h, hs = stats["haltwire"], stats[HANDSHAKE]
        cpu_ratio = (hs.proxy_cpu_s / hs.proxy_cpu_calls) / (h.proxy_cpu_s / h.proxy_cpu_calls)
        print()
        print(
            f"    session-keeping client ({HANDSHAKE}) against sessionless (haltwire), same gateway: "
            f"p50 {p50[HANDSHAKE] / p50['haltwire']:.2f}x, gateway CPU per call {cpu_ratio:.2f}x; "
            f"target CPU <= {MAX_HANDSHAKE_CPU_RATIO:.2f}x (both on the fast path)"
        )
        checks.append(
            (
                f"session-keeping clients' gateway CPU per call <= {MAX_HANDSHAKE_CPU_RATIO:.2f}x sessionless",
                cpu_ratio <= MAX_HANDSHAKE_CPU_RATIO,
            )
        )
    if "haltwire" in stats and TRIPWIRES in stats:
        ratio = p50[TRIPWIRES] / p50["haltwire"]
        per_round = [
            t / h for t, h in zip(stats[TRIPWIRES].rounds_p50, stats["haltwire"].rounds_p50, strict=True)
        ]
        print()
        print(
            f"    haltwire + 5 tripwires ({TRIPWIRES}, with a lease) against haltwire without rules: "
            f"p50 {ratio:.3f}x ({p50[TRIPWIRES]:.2f} against {p50['haltwire']:.2f} ms; per round "
            f"{min(per_round):.2f}-{max(per_round):.2f}x), p99 {p99[TRIPWIRES] / p99['haltwire']:.2f}x, "
            f"calls/s {tput[TRIPWIRES] / tput['haltwire']:.2f}x; target p50 <= {MAX_TRIPWIRE_RATIO:.2f}x"
        )
        checks.append(
            (
                f"haltwire + 5 tripwires p50 <= {MAX_TRIPWIRE_RATIO:.2f}x haltwire p50",
                ratio <= MAX_TRIPWIRE_RATIO,
            )
        )
    return checks
