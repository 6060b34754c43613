"""How long ``haltwire drill --embedded`` takes with every rung (issue 16: ``--reps 20`` in
under five minutes on this 2-core machine).

Run from the repository root::

    .venv/bin/python benchmarks/drill.py             # --reps 20, target 300 s
    .venv/bin/python benchmarks/drill.py --quick     # --reps 3, target 90 s

It runs the drill as a user would (``python -m haltwire drill --embedded --reps N``, its table
on stdout passed through), and prints the wall time, the machine's load average before and
after (the drill shares the CPU with whatever else runs), and the target. Exit 0 when the drill
passed within the target, 1 when it took longer, 2 when the drill itself failed (its exit
status and stderr's end printed), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="--reps 3 against a 90 s target")
    parser.add_argument("--reps", type=int, help="reps per rung (default 20; 3 with --quick)")
    parser.add_argument(
        "--target-s", type=float, help="the wall time to stay under (default 300; 90 with --quick)"
    )
    args = parser.parse_args()
    reps = args.reps or (3 if args.quick else 20)
    target_s = args.target_s or (90.0 if args.quick else 300.0)
    if reps < 1 or target_s <= 0:
        print("benchmarks/drill.py: --reps and --target-s must be positive", file=sys.stderr)
        return 2
    command = [sys.executable, "-m", "haltwire", "drill", "--embedded", "--reps", str(reps)]
    before = os.getloadavg()[0]
    start = time.monotonic()
    try:
        done = subprocess.run(
            command, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False
        )
    except KeyboardInterrupt:
        return 130
    took = time.monotonic() - start
    after = os.getloadavg()[0]
    print(
        f"haltwire drill --embedded --reps {reps}: {took:.1f} s wall (load average {before:.1f} before, {after:.1f} after)"
    )
    if done.returncode != 0:
        tail = "\n".join(done.stderr.splitlines()[-8:])
        print(f"the drill failed with exit status {done.returncode}:\n{tail}", file=sys.stderr)
        return 2
    met = took < target_s
    print(f"target: under {target_s:g} s: {'met' if met else 'MISSED'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
