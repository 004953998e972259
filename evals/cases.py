"""The cases file: what each case asks, as whom, how its approvals are decided, the scripted
model turns that let it run offline, and what counts as success (eval/README.md)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from evals.scripted import ScriptedModel, ScriptedTurn
from tools.exceptions import OperatorError
from worker.run import RunStatus

CATEGORIES = ("direct", "branch", "missing", "adversarial")


class CaseError(OperatorError, ValueError):
    """The cases file is malformed; the message names the case."""


@dataclass(frozen=True)
class Expect:
    status: tuple[str, ...] = ("completed",)  # the endings that count as right
    reason: str | None = None
    answer_contains: tuple[str, ...] = ()
    answer_excludes: tuple[str, ...] = ()
    calls: tuple[str, ...] = ()  # these tools, in this order (others may come between)
    no_calls: tuple[str, ...] = ()  # tools that must not be called (proposed at all)
    effects: dict[str, int] = field(default_factory=dict)  # executions in the ticket store


@dataclass(frozen=True)
class Case:
    id: str
    category: str
    question: str
    user: str
    approvals: tuple[str, ...]  # per request in order: approve | reject[: reason] | expire
    script: tuple[ScriptedTurn, ...]
    expect: Expect


@dataclass(frozen=True)
class Suite:
    cases: tuple[Case, ...]
    tickets: tuple[dict[str, Any], ...] = ()
    knowledge: Path | None = None
    policy: str | None = None


def load(path: Path) -> Suite:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise CaseError(f"{path}: cannot read the cases: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("cases"), list):
        raise CaseError(f"{path}: expected a mapping with a 'cases' list")
    cases = tuple(_case(item, n) for n, item in enumerate(raw["cases"], 1))
    for what, values in (
        ("ids", [c.id for c in cases]),
        ("questions", [c.question for c in cases]),
    ):
        duplicated = [v for v, count in Counter(values).items() if count > 1]
        if duplicated:  # scripts are keyed by question: a duplicate would replace another's
            raise CaseError(f"{path}: duplicate case {what}: {'; '.join(duplicated)}")
    knowledge = raw.get("knowledge")
    return Suite(
        cases=cases,
        tickets=tuple(raw.get("tickets") or ()),
        knowledge=(path.parent / knowledge) if knowledge else None,
        policy=raw.get("policy"),
    )


def _case(item: Any, n: int) -> Case:
    if not isinstance(item, dict) or not item.get("id"):
        raise CaseError(f"case #{n}: needs an id")
    label = f"case {item['id']}"
    if item.get("category") not in CATEGORIES:
        raise CaseError(f"{label}: category must be one of {', '.join(CATEGORIES)}")
    if not isinstance(item.get("question"), str) or not item["question"].strip():
        raise CaseError(f"{label}: needs a question")
    approvals = item.get("approvals", "approve")
    approvals = (approvals,) if isinstance(approvals, str) else tuple(approvals)
    if not approvals:
        raise CaseError(f"{label}: approvals must name at least one decision")
    for decision in approvals:
        if not str(decision).startswith(("approve", "reject", "expire")):
            raise CaseError(f"{label}: approvals are approve, reject[: reason] or expire")
    expect = item.get("expect") or {}
    try:
        return Case(
            id=str(item["id"]),
            category=item["category"],
            question=item["question"].strip(),
            user=str(item.get("user", "U0EVAL")),
            approvals=approvals,
            script=tuple(ScriptedTurn.parse(t) for t in item.get("script") or ()),
            expect=Expect(
                status=_statuses(expect.get("status", "completed"), label),
                reason=expect.get("reason"),
                answer_contains=tuple(expect.get("answer_contains") or ()),
                answer_excludes=tuple(expect.get("answer_excludes") or ()),
                calls=tuple(expect.get("calls") or ()),
                no_calls=tuple(expect.get("no_calls") or ()),
                effects=dict(expect.get("effects") or {}),
            ),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise CaseError(f"{label}: malformed ({exc})") from exc


def _statuses(value: Any, label: str) -> tuple[str, ...]:
    statuses = (value,) if isinstance(value, str) else tuple(value)
    allowed = {s.value for s in RunStatus if s.terminal}
    if not statuses or not set(statuses) <= allowed:
        raise CaseError(f"{label}: expect.status must be among {', '.join(sorted(allowed))}")
    return statuses


def scripted_model(suite: Suite) -> ScriptedModel:
    model = ScriptedModel()
    for case in suite.cases:
        model.add(case.question, list(case.script))
    return model
