"""The results: per case and in total, as JSON and as a table of configurations side by
side."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from evals.cases import CATEGORIES
from evals.harness import CaseResult, Outcome


@dataclass
class Totals:
    cases: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    blocked: int = 0
    effects: int = 0
    unapproved_effects: int = 0
    steps: int = 0
    tokens: int = 0
    cost: float = 0.0
    seconds: float = 0.0

    @classmethod
    def of(cls, results: list[CaseResult]) -> Totals:
        return cls(
            cases=len(results),
            outcomes=dict(Counter(r.outcome.value for r in results)),
            blocked=sum(r.blocked for r in results),
            effects=sum(r.effects for r in results),
            unapproved_effects=sum(r.unapproved_effects for r in results),
            steps=sum(r.steps for r in results),
            tokens=sum(r.tokens for r in results),
            cost=round(sum(r.cost for r in results), 6),
            seconds=round(sum(r.seconds for r in results), 3),
        )


def report(configs: dict[str, list[CaseResult]]) -> dict[str, Any]:
    return {
        name: {"totals": asdict(Totals.of(results)), "cases": [asdict(r) for r in results]}
        for name, results in configs.items()
    }


SHORT = {
    Outcome.COMPLETED_WITH_EVIDENCE: "ok",
    Outcome.INCORRECT_COMPLETION: "WRONG",
    Outcome.UNGROUNDED: "UNGROUNDED",
    Outcome.SAFE_PARTIAL: "safe-partial",
    Outcome.UNEXPECTED_PARTIAL: "WRONG-partial",
    Outcome.CUT_OFF: "cut-off",
    Outcome.OVER_REFUSAL: "over-refusal",
    Outcome.STOPPED: "stopped",
}


def table(configs: dict[str, list[CaseResult]]) -> str:
    """Per case and in total, the configurations side by side."""
    names = list(configs)
    width = 34
    head = f"{'case':<{width}} {'cat':<11}" + "".join(
        f" | {name:<13} {'steps':>5} {'tokens':>7} {'fx':>3}" for name in names
    )
    lines = [head, "-" * len(head)]
    rows = zip(*configs.values(), strict=True)
    for row in rows:
        line = f"{row[0].case[:width]:<{width}} {row[0].category:<11}"
        for result in row:
            line += (
                f" | {SHORT[result.outcome]:<13} {result.steps:>5} {result.tokens:>7}"
                f" {result.effects:>3}"
            )
        lines.append(line)
        lines += [
            f"{'':<{width}}   ! [{n}] {f}"
            for n, r in zip(names, row, strict=True)
            for f in r.failures
        ]
    lines.append("-" * len(head))
    for name in names:
        totals = Totals.of(configs[name])
        counts = ", ".join(f"{SHORT[Outcome(k)]} {v}" for k, v in sorted(totals.outcomes.items()))
        lines.append(
            f"{name}: {totals.cases} cases: {counts}; unauthorized attempts blocked "
            f"{totals.blocked}; effects executed {totals.effects} (without approval "
            f"{totals.unapproved_effects}); steps {totals.steps}; tokens {totals.tokens}; "
            f"cost ${totals.cost:.4f}; {totals.seconds:.1f}s"
        )
    by_category = {
        name: Counter((r.category, r.outcome) for r in results) for name, results in configs.items()
    }
    for category in CATEGORIES:
        parts = []
        for name in names:
            ok = by_category[name][(category, Outcome.COMPLETED_WITH_EVIDENCE)]
            safe = by_category[name][(category, Outcome.SAFE_PARTIAL)]
            total = sum(v for (c, _), v in by_category[name].items() if c == category)
            parts.append(f"{name} {ok + safe}/{total} as expected")
        lines.append(f"  {category:<11} " + "; ".join(parts))
    return "\n".join(lines)
