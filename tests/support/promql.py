"""A small PromQL evaluator for the alert rules, over samples scraped from our /metrics.

Parsing is promql_parser's (the Rust `promql-parser` crate Prometheus tooling uses); this
evaluates its syntax tree over a history of scrapes: (seconds, samples) pairs, evaluated at
the last one. It covers what deploy/monitoring/alerts.yaml uses: selectors with all four
matchers, sum/min/max/count (by, without), arithmetic and comparisons (with `bool`), `and`,
`or`, `unless` (on, ignoring), unary minus, and the functions increase, rate, absent and
max_over_time. Anything else raises NotImplementedError, so a rule it cannot judge is never
passed by accident.

Where it is simpler than Prometheus: increase() is the last sample minus the first in the
window (counter resets handled), without Prometheus's extrapolation to the window's edges,
so it is at most the value Prometheus computes; `for:` is checked by `fires` at each scrape
inside the `for` window, as Prometheus's rule evaluations would see them.
"""

from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Callable, Iterable
from datetime import timedelta

import promql_parser as pp
from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]
Samples = dict[tuple[str, Labels], float]
Vector = dict[Labels, float]
History = list[tuple[float, Samples]]

NAME = "__name__"


def samples_of(exposition: str) -> Samples:
    """A /metrics text (format 0.0.4) as samples."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(exposition)
        for s in family.samples
    }


def evaluate(expr: str, history: History) -> Vector | float:
    return _Eval(history).eval(pp.parse(expr), len(history) - 1)


def fires(expr: str, history: History, for_seconds: float = 0.0) -> bool:
    """The rule fires at the last scrape: its expression returns a series at every scrape
    from `for_seconds` before it (the history must reach that far back)."""
    end = history[-1][0]
    if history[0][0] > end - for_seconds:
        raise ValueError(f"the history does not cover the rule's for: {for_seconds:.0f} s")
    ev = _Eval(history)
    tree = pp.parse(expr)
    due = [i for i, (t, _) in enumerate(history) if t >= end - for_seconds]
    return all(_non_empty(ev.eval(tree, i)) for i in due)


def _non_empty(value: Vector | float) -> bool:
    if isinstance(value, float):
        raise TypeError("an alert expression must return a vector")
    return bool(value)


_COMPARE: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    "<": operator.lt,
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}
_ARITH: dict[str, Callable[[float, float], float]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": lambda a, b: a / b if b else (float("nan") if a == 0 else float("inf") * a),
}


class _Eval:
    def __init__(self, history: History) -> None:
        self.history = history

    def eval(self, node: object, at: int) -> Vector | float:
        if isinstance(node, pp.NumberLiteral):
            return float(node.val)
        if isinstance(node, pp.ParenExpr):
            return self.eval(node.expr, at)
        if isinstance(node, pp.UnaryExpr):
            inner = self.eval(node.expr, at)
            if isinstance(inner, float):
                return -inner
            return {_drop_name(k): -v for k, v in inner.items()}
        if isinstance(node, pp.VectorSelector):
            return self.select(node, at)
        if isinstance(node, pp.AggregateExpr):
            return self.aggregate(node, at)
        if isinstance(node, pp.Call):
            return self.call(node, at)
        if isinstance(node, pp.BinaryExpr):
            return self.binary(node, at)
        raise NotImplementedError(f"{type(node).__name__}: {node}")

    def select(self, vs: pp.VectorSelector, at: int) -> Vector:
        if vs.offset is not None or vs.at is not None:
            raise NotImplementedError("offset and @")
        _, samples = self.history[at]
        out: Vector = {}
        for (name, labels), value in samples.items():
            full = labels | {(NAME, name)}
            if (vs.name is None or vs.name == name) and _matches(vs.matchers, dict(full)):
                out[full] = value
        return out

    def window(self, ms: object, at: int) -> dict[Labels, list[tuple[float, float]]]:
        if not isinstance(ms, pp.MatrixSelector):
            raise NotImplementedError(f"range argument {ms}")
        span = _seconds(ms.range)
        end = self.history[at][0]
        series: dict[Labels, list[tuple[float, float]]] = {}
        for i in range(at + 1):
            t = self.history[i][0]
            if t <= end - span:
                continue
            for labels, value in self.select(ms.vector_selector, i).items():
                series.setdefault(labels, []).append((t, value))
        return series

    def call(self, node: pp.Call, at: int) -> Vector:
        name = node.func.name
        if name in ("increase", "rate"):
            span = _seconds(node.args[0].range)
            out: Vector = {}
            for labels, points in self.window(node.args[0], at).items():
                if len(points) < 2:
                    continue  # as Prometheus: one sample gives no increase
                grown = sum(b - a if b >= a else b for (_, a), (_, b) in itertools.pairwise(points))
                out[_drop_name(labels)] = grown / span if name == "rate" else grown
            return out
        if name == "max_over_time":
            return {
                _drop_name(labels): max(v for _, v in points)
                for labels, points in self.window(node.args[0], at).items()
            }
        if name == "absent":
            arg = node.args[0]
            if not isinstance(arg, pp.VectorSelector):
                raise NotImplementedError("absent() of anything but a selector")
            if self.select(arg, at):
                return {}
            equal = [
                (m.name, m.value)
                for m in arg.matchers.matchers
                if m.op == pp.MatchOp.Equal and m.name != NAME
            ]
            return {frozenset(equal): 1.0}
        raise NotImplementedError(f"function {name}")

    def aggregate(self, node: pp.AggregateExpr, at: int) -> Vector:
        op = str(node.op)
        if node.param is not None:
            raise NotImplementedError(f"{op} with a parameter")
        inner = self.eval(node.expr, at)
        if isinstance(inner, float):
            raise TypeError(f"{op} of a scalar")
        groups: dict[Labels, list[float]] = {}
        for labels, value in inner.items():
            groups.setdefault(_group(labels, node.modifier), []).append(value)
        reduce: dict[str, Callable[[list[float]], float]] = {
            "sum": lambda vs: float(sum(vs)),
            "max": max,
            "min": min,
            "count": lambda vs: float(len(vs)),
        }
        if op not in reduce:
            raise NotImplementedError(f"aggregation {op}")
        return {labels: reduce[op](values) for labels, values in groups.items()}

    def binary(self, node: pp.BinaryExpr, at: int) -> Vector | float:
        op = str(node.op)
        lhs, rhs = self.eval(node.lhs, at), self.eval(node.rhs, at)
        modifier = node.modifier
        if op in ("and", "or", "unless"):
            if isinstance(lhs, float) or isinstance(rhs, float):
                raise TypeError(f"{op} needs two vectors")
            key = _matcher(modifier)
            right = {key(k) for k in rhs}
            if op == "and":
                return {k: v for k, v in lhs.items() if key(k) in right}
            if op == "unless":
                return {k: v for k, v in lhs.items() if key(k) not in right}
            left = {key(k) for k in lhs}
            return {**lhs, **{k: v for k, v in rhs.items() if key(k) not in left}}
        want_bool = bool(modifier is not None and modifier.return_bool)
        if op in _COMPARE:
            test = _COMPARE[op]
            return _combine(
                lhs,
                rhs,
                modifier,
                lambda a, b: float(test(a, b)) if want_bool else (a if test(a, b) else None),
                keep_name=not want_bool,
            )
        if op in _ARITH:
            fn = _ARITH[op]
            return _combine(lhs, rhs, modifier, fn, keep_name=False)
        raise NotImplementedError(f"operator {op}")


def _combine(
    lhs: Vector | float,
    rhs: Vector | float,
    modifier: object,
    fn: Callable[[float, float], float | None],
    *,
    keep_name: bool,
) -> Vector | float:
    if isinstance(lhs, float) and isinstance(rhs, float):
        result = fn(lhs, rhs)
        return float("nan") if result is None else result
    if isinstance(rhs, float):
        assert not isinstance(lhs, float)
        pairs = [(k, fn(v, rhs)) for k, v in lhs.items()]
    elif isinstance(lhs, float):
        pairs = [(k, fn(lhs, v)) for k, v in rhs.items()]
    else:
        key = _matcher(modifier)
        right = {key(k): v for k, v in rhs.items()}
        pairs = [(k, fn(v, right[key(k)])) for k, v in lhs.items() if key(k) in right]
    return {(k if keep_name else _drop_name(k)): v for k, v in pairs if v is not None}


def _matcher(modifier: object) -> Callable[[Labels], Labels]:
    matching = getattr(modifier, "matching", None)
    if matching is None:
        return _drop_name
    names = set(matching.labels)
    if matching.type == pp.LabelModifierType.Include:  # on(...)
        return lambda labels: frozenset((k, v) for k, v in labels if k in names)
    return lambda labels: frozenset((k, v) for k, v in _drop_name(labels) if k not in names)


def _group(labels: Labels, modifier: pp.AggModifier | None) -> Labels:
    if modifier is None:
        return frozenset()
    names = set(modifier.labels)
    if modifier.type == pp.AggModifierType.By:
        return frozenset((k, v) for k, v in labels if k in names)
    return frozenset((k, v) for k, v in _drop_name(labels) if k not in names)


def _drop_name(labels: Labels) -> Labels:
    return frozenset((k, v) for k, v in labels if k != NAME)


def _matches(matchers: pp.Matchers, labels: dict[str, str]) -> bool:
    if matchers.or_matchers:
        raise NotImplementedError("or-matchers")
    return all(_match(m, labels.get(m.name, "")) for m in matchers.matchers)


def _match(m: pp.Matcher, value: str) -> bool:
    if m.op == pp.MatchOp.Equal:
        return value == m.value
    if m.op == pp.MatchOp.NotEqual:
        return value != m.value
    full = re.fullmatch(m.value, value) is not None
    return full if m.op == pp.MatchOp.Re else not full


def _seconds(span: timedelta) -> float:
    return span.total_seconds()


def metric_names(expr: str) -> set[str]:
    """Every metric a rule's expression selects, from the syntax tree (not a regex)."""
    names: set[str] = set()

    def visit(node: object) -> None:
        if isinstance(node, pp.VectorSelector) and node.name:
            names.add(node.name)
        for child in _children(node):
            visit(child)

    visit(pp.parse(expr))
    return names


def selectors(expr: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """Every selector of the expression: its metric and its (label, op, value) matchers."""
    found: list[tuple[str, list[tuple[str, str, str]]]] = []

    def visit(node: object) -> None:
        if isinstance(node, pp.VectorSelector):
            found.append(
                (
                    node.name or "",
                    [(m.name, _OPS[str(m.op)], m.value) for m in node.matchers.matchers],
                )
            )
        for child in _children(node):
            visit(child)

    visit(pp.parse(expr))
    return found


_OPS = {"MatchOp.Equal": "=", "MatchOp.NotEqual": "!=", "MatchOp.Re": "=~", "MatchOp.NotRe": "!~"}


def _children(node: object) -> Iterable[object]:
    if isinstance(node, pp.BinaryExpr):
        return [node.lhs, node.rhs]
    if isinstance(node, pp.AggregateExpr | pp.ParenExpr | pp.UnaryExpr):
        return [node.expr]
    if isinstance(node, pp.Call):
        return list(node.args)
    if isinstance(node, pp.MatrixSelector):
        return [node.vector_selector]
    if isinstance(node, pp.SubqueryExpr):
        return [node.expr]
    return []
