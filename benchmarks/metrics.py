"""What the gateway's metrics add to one tool call's CPU, measured alone (no HTTP, no upstream).

Run from the repository root::

    .venv/bin/python benchmarks/metrics.py            # 200,000 calls, best of 5
    .venv/bin/python benchmarks/metrics.py --quick    # 50,000 calls, best of 3

Per call, ``Gateway._observed`` does what is timed here: four ``perf_counter`` reads, the
in-flight count up and down, the call's and the upstream's latency observed, the call counted by
tool and outcome, a lease counted; a refused call (no upstream) counts its refusal instead.
Measured as process CPU time, so a loaded machine slows it less than wall time. Also measured:
a call to a made-up tool name (labelled ``unknown``, never kept) and a scrape of ``/metrics``'
body with every series of a busy gateway. Target: the added CPU per call stays under 5 µs, a
small part of the 400 µs the gateway's whole call is to cost (issue 18). Exits 1 when missed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from haltwire import refusal
from haltwire.metrics import GatewayMetrics, exposition, outcome_of

TARGET_US = 5.0
RESULT = {"content": [], "isError": False}


def per_call_us(work: Callable[[], None], calls: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(calls):
            work()
        best = min(best, time.process_time() - start)
    return best / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls")
    args = parser.parse_args()
    calls, repeats = (50_000, 3) if args.quick else (200_000, 5)
    metrics = GatewayMetrics(lambda name: name == "lookup_order")
    refused = refusal.budget_exhausted("ops-bot", 10, time.time() + 60, "lookup_order")

    def served() -> None:
        started = time.perf_counter()
        metrics.in_flight += 1
        upstream = time.perf_counter()
        metrics.upstream_duration("demo", time.perf_counter() - upstream)
        metrics.in_flight -= 1
        metrics.tool_duration(time.perf_counter() - started)
        metrics.tool_calls.count("lookup_order", outcome_of(RESULT))
        metrics.lease_accepted()

    def refused_call() -> None:
        started = time.perf_counter()
        metrics.in_flight += 1
        metrics.in_flight -= 1
        metrics.tool_duration(time.perf_counter() - started)
        metrics.tool_calls.count("lookup_order", outcome_of(refused))
        metrics.refused(refused)

    def made_up() -> None:
        metrics.tool_calls.count("made_up_tool", "error")

    def nothing() -> None:
        pass

    baseline = per_call_us(nothing, calls, repeats)
    served_us = per_call_us(served, calls, repeats) - baseline
    refused_us = per_call_us(refused_call, calls, repeats) - baseline
    made_up_us = per_call_us(made_up, calls, repeats) - baseline
    scrape_start = time.process_time()
    body = exposition(metrics.registry)
    scrape_ms = (time.process_time() - scrape_start) * 1e3
    print(f"metrics per served call:      {served_us:6.2f} µs CPU")
    print(f"metrics per refused call:     {refused_us:6.2f} µs CPU")
    print(f"a made-up tool name's count:  {made_up_us:6.2f} µs CPU")
    print(f"a scrape's body:              {scrape_ms:6.2f} ms CPU ({len(body)} bytes)")
    met = max(served_us, refused_us) < TARGET_US
    print(f"Target: [{'met' if met else 'MISSED'}] metrics add < {TARGET_US:g} µs CPU to a served or refused call")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
