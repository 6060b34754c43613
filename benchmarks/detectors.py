"""What the built-in content detector costs per scan, by text size and kind.

Run from the repository root::

    .venv/bin/python benchmarks/detectors.py            # about 10 seconds
    .venv/bin/python benchmarks/detectors.py --rounds 50

Texts (each scanned ``--rounds`` times after a warm-up; p50 and p99 of the wall time):

- ``order 1 KiB``, ``orders 64 KiB``: the demo shop's ``read_order`` answers (text and
  structuredContent, as ``result_text`` extracts them), benign, ASCII;
- ``prose 64 KiB``: benign English reviews and order lines with curly quotes, accents and
  emoji (not ASCII, so the Unicode steps run);
- ``cue words 64 KiB``: text made of the words the patterns wait for ("system", "note",
  "agents", "policy", "refund all", "ignore", "instructions", "user:"), so every pattern
  runs; benign but the worst case for time;
- ``injection 64 KiB``: the prose with the demo's injected review in the middle.

Exit 1 if a scan's CPU time (p50, ``time.thread_time``) misses its target, printed beside
it: the cost of a scan, which the machine's other load does not change. Wall-clock p50 and
p99 are printed too; on a loaded machine they grow while the CPU time does not.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from typing import Final

from haltwire.demo.shop import INJECTION, ORDERS
from haltwire.tripwires.detectors import BuiltinDetector, result_text

KIB: Final = 1024
#: Targets for the CPU time of a scan (p50), in microseconds.
TARGETS: Final = {
    "order 1 KiB": 300.0,
    "orders 64 KiB": 5_000.0,
    "prose 64 KiB": 10_000.0,
    "injection 64 KiB": 10_000.0,
    "cue words 64 KiB": 30_000.0,
}


def order_text(size: int) -> str:
    parts = []
    for order in ORDERS.values():
        if order.review == INJECTION:
            continue
        result = {
            "content": [{"type": "text", "text": f"Order {order.order_id} by {order.customer}. Review: {order.review}"}],
            "structuredContent": {**order.summary(), "review": order.review},
        }
        parts.append(result_text(result))
    text = "\n".join(parts)
    return (text * (size // len(text) + 1))[:size]


def prose(size: int, seed: int = 7) -> str:
    rng = random.Random(seed)
    pieces = [o.review for o in ORDERS.values() if o.review != INJECTION] + [
        "The kettle’s lid is “stiff” at first — it loosens after a week. 👍",
        "Délivré rapidement, très bon produit. Würde es wieder kaufen.",
        "See the [manual](https://example.com/manual?lang=en) for descaling instructions.",
        json.dumps({"order_id": "A-1001", "amount_cents": 4599, "status": "shipped"}),
        "The customer asked about the return policy and the warranty period.",
        "Our team 👩‍💻 fixed the firmware bug; update via the app.",
    ]
    out: list[str] = []
    total = 0
    while total < size:
        piece = rng.choice(pieces)
        out.append(piece)
        total += len(piece) + 1
    return "\n".join(out)[:size]


def cue_words(size: int, seed: int = 7) -> str:
    rng = random.Random(seed)
    words = [
        *("system", "note", "message", "agents", "assistant", "policy", "changed", "refund", "all", "orders"),
        *("ignore", "the", "instructions", "user:", "human:", "send", "data", "to", "https://example.com"),
        *("add", "image", "url", "new", "you", "now", "must", "every", "[link](https://example.com/x)"),
    ]
    out: list[str] = []
    total = 0
    while total < size:
        word = rng.choice(words)
        out.append(word + ("\n" if rng.random() < 0.1 else " "))
        total += len(word) + 1
    return "".join(out)[:size]


def measure(detector: BuiltinDetector, text: str, rounds: int) -> tuple[float, float, float, int]:
    """CPU p50, wall p50 and wall p99 in µs, and the signals found."""
    for _ in range(3):
        detector.scan(text)
    cpu, wall = [], []
    for _ in range(rounds):
        start_cpu, start = time.thread_time(), time.perf_counter()
        found = detector.scan(text)
        wall.append((time.perf_counter() - start) * 1e6)
        cpu.append((time.thread_time() - start_cpu) * 1e6)
    wall.sort()
    p99 = wall[min(len(wall) - 1, int(len(wall) * 0.99))]
    return statistics.median(cpu), statistics.median(wall), p99, len(found)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    body = prose(64 * KIB)
    middle = len(body) // 2
    texts = {
        "order 1 KiB": order_text(KIB),
        "orders 64 KiB": order_text(64 * KIB),
        "prose 64 KiB": body,
        "injection 64 KiB": (body[:middle] + "\n" + INJECTION + "\n" + body[middle:])[: 64 * KIB],
        "cue words 64 KiB": cue_words(64 * KIB),
    }
    detector = BuiltinDetector()
    failed = False
    print(f"{'text':<18} {'chars':>7} {'cpu p50':>9} {'target':>9} {'wall p50':>9} {'wall p99':>9}  signals  (µs)")
    for name, text in texts.items():
        cpu, p50, p99, signals = measure(detector, text, args.rounds)
        ok = cpu <= TARGETS[name]
        failed |= not ok
        mark = "" if ok else "  MISSED"
        print(f"{name:<18} {len(text):>7} {cpu:>9.0f} {TARGETS[name]:>9.0f} {p50:>9.0f} {p99:>9.0f}  {signals}{mark}")
    expected = {"order 1 KiB": 0, "orders 64 KiB": 0, "prose 64 KiB": 0, "injection 64 KiB": 1}
    for name, count in expected.items():
        if len(detector.scan(texts[name])) != count:
            print(f"{name}: expected {count} signal(s)")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
