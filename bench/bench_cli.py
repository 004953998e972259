"""How fast the command line starts: `switchboard --version` and `switchboard --help`, as a
ratio against `python -c pass` with the same interpreter, measured in the same run (issue 20:
target ≤ 2×; before the CLI imported its verbs lazily it was 20–60×).

Each command runs as a whole process, `-n` times, the three interleaved round by round so
the machine's load falls on each alike; the figure is the ratio of the medians. The
`switchboard` command is the one `pip install` put beside this interpreter (the console
script: what people and the process supervisor run).

    python bench/bench_cli.py           # 30 rounds, ~15 s
    python bench/bench_cli.py -n 100 --json cli.json
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from common import dump_json, median, row, verdict

TARGET = 2.0


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=30, help="rounds (default 30)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures here")
    args = parser.parse_args()
    script = Path(sys.executable).parent / "switchboard"
    if not script.exists():
        print(f"no {script}: install the project first (pip install -e '.[dev]')")
        return 2
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "switchboard --version": [str(script), "--version"],
        "switchboard --help": [str(script), "--help"],
    }
    for command in commands.values():  # warm the page cache and the .pyc files
        timed(command)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.n):
        for name, command in commands.items():
            times[name].append(timed(command))
    base = median(times["python -c pass"])
    print(f"== CLI start-up, {args.n} rounds interleaved, medians")
    row("python -c pass (baseline)", f"{base * 1000:.1f} ms")
    figures: dict[str, float] = {"baseline_ms": base * 1000}
    ok = True
    for name in ("switchboard --version", "switchboard --help"):
        value = median(times[name])
        ratio = value / base
        ok = ok and ratio <= TARGET
        figures[name] = ratio
        row(name, f"{value * 1000:.1f} ms, {ratio:.2f}x the baseline (target <= {TARGET}x)")
    row("verdict", verdict(ok))
    dump_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
