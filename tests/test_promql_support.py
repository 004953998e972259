"""The alert tests' PromQL evaluator (tests/support/promql.py) against what Prometheus does,
on hand-made samples: a rule it gets wrong would pass or fail for the wrong reason."""

from __future__ import annotations

import pytest

from tests.support.promql import History, evaluate, fires, metric_names, selectors

A, B = frozenset({("kind", "a")}), frozenset({("kind", "b")})
HISTORY: History = [
    (0.0, {("c_total", A): 1.0, ("c_total", B): 5.0, ("up", frozenset()): 1.0}),
    (60.0, {("c_total", A): 4.0, ("c_total", B): 5.0, ("up", frozenset()): 0.0}),
    (120.0, {("c_total", A): 1.0, ("c_total", B): 5.0}),  # A reset to 1; `up` went away
]


def test_increase_and_rate_follow_counters_across_a_reset():
    assert evaluate("increase(c_total[5m])", HISTORY) == {A: 4.0, B: 0.0}  # 3, then reset +1
    assert evaluate("sum(rate(c_total[5m]))", HISTORY) == {frozenset(): 4.0 / 300}
    assert evaluate('increase(c_total{kind="a"}[1m])', HISTORY) == {}  # one sample: no result


def test_comparisons_filter_unless_bool_and_set_operators_match_labels():
    assert evaluate("increase(c_total[5m]) > 0", HISTORY) == {A: 4.0}
    assert evaluate("increase(c_total[5m]) > bool 0", HISTORY) == {A: 1.0, B: 0.0}
    assert evaluate('c_total{kind="a"} and c_total{kind!="a"}', HISTORY) == {}
    assert evaluate('sum(c_total) > 0 and on() sum(c_total{kind="b"}) == 5', HISTORY) == {
        frozenset(): 6.0
    }
    assert evaluate('c_total{kind=~"a|b"} unless c_total{kind="b"}', HISTORY) == {
        A | {("__name__", "c_total")}: 1.0
    }


def test_absent_and_or_cover_a_series_that_is_gone():
    assert evaluate("absent(up)", HISTORY[:2]) == {}
    assert evaluate('absent(up{job="sb"})', HISTORY) == {frozenset({("job", "sb")}): 1.0}
    assert evaluate("min(up) == 0 or absent(up)", HISTORY[:2]) == {frozenset(): 0.0}
    assert evaluate("min(up) == 0 or absent(up)", HISTORY) == {frozenset(): 1.0}


def test_for_needs_the_condition_at_every_evaluation_in_its_window():
    assert fires("min(up) == 0 or absent(up)", HISTORY, 60)
    assert not fires("min(up) == 0 or absent(up)", HISTORY, 120)  # at t=0 up was 1
    with pytest.raises(ValueError, match="does not cover"):
        fires("absent(up)", HISTORY, 600)


def test_what_it_does_not_know_it_refuses():
    with pytest.raises(NotImplementedError):
        evaluate("histogram_quantile(0.9, c_total)", HISTORY)
    with pytest.raises(NotImplementedError):
        evaluate("topk(1, c_total)", HISTORY)


def test_names_and_selectors_come_from_the_syntax_tree():
    expr = 'sum(rate(c_total{kind=~"a|b"}[5m])) / sum(up) or absent(x_total{job!="y"})'
    assert metric_names(expr) == {"c_total", "up", "x_total"}
    assert ("c_total", [("kind", "=~", "a|b")]) in selectors(expr)
    assert ("x_total", [("job", "!=", "y")]) in selectors(expr)
