"""The chaos soak: a real stack under load while a seeded schedule of faults runs, then the
invariants (see tests/support/chaos.py). Prints the schedule first and the report last.

    nice python bench/chaos_soak.py --minutes 10 --seed 27 --workers 3 [--json PATH]

Needs Debian's redis-server and redis-sentinel (apt-get install -y redis-server
redis-sentinel). Exit status 1 when an invariant was violated.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import common  # noqa: F401 - puts the project root on sys.path

from tests.support import chaos


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="load for this long")
    parser.add_argument("--seed", type=int, default=27, help="the fault schedule's seed")
    parser.add_argument("--workers", type=int, default=3, help="worker processes")
    parser.add_argument("--people", type=int, default=6, help="people asking at once")
    parser.add_argument("--gap", type=float, default=2.5, help="mean seconds between faults")
    parser.add_argument("--keep", type=Path, help="keep the logs in this folder")
    parser.add_argument("--json", type=Path, help="write the report's figures here")
    args = parser.parse_args()
    missing = chaos.available()
    if missing:
        print(f"chaos soak skipped: {missing}")
        return 0
    # the machine is shared: say how busy it was (1-minute load average, cores)
    print(f"load average at the start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="chaos-") as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        soak = chaos.Soak(
            folder,
            seconds=args.minutes * 60,
            seed=args.seed,
            workers=args.workers,
            people=args.people,
            gap=args.gap,
        )
        report = soak.run(say=lambda line: print(line, flush=True))
    print()
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for line in report.lines():
        print(line)
    if args.json:
        args.json.write_text(json.dumps(report.figures(), indent=2))
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
