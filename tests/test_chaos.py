"""The chaos soak for a minute (bench/chaos_soak.py runs it for longer): a real stack under
load, every kind of fault at least once at seeded random times, and nothing lost."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import chaos

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

SECONDS = float(os.environ.get("SWITCHBOARD_CHAOS_SECONDS") or 25)
SEED = int(os.environ.get("SWITCHBOARD_CHAOS_SEED") or 27)


def test_a_minute_of_chaos_under_load_loses_nothing_and_runs_no_write_twice(tmp_path: Path):
    missing = chaos.available()
    if missing:
        pytest.skip(f"the chaos soak needs Redis and Sentinel: {missing}")
    soak = chaos.Soak(tmp_path, seconds=SECONDS, seed=SEED, workers=2, people=4, gap=1.0)
    planned = {fault.kind for fault in soak.faults}
    left_out = set(chaos.KINDS) - planned  # the schedule's, not the product's: said first
    assert not left_out, f"seed {SEED}'s {SECONDS:g} s schedule leaves out {sorted(left_out)}"
    report = soak.run()
    print("\n".join(report.lines()))
    assert report.violations == []
    assert not report.fault_errors
    kinds = set(report.injected)
    assert kinds == planned, f"scheduled, not injected: {planned - kinds}"
    assert report.runs_started >= 10 and report.runs_ended == report.runs_started
    assert report.drained_in is not None
