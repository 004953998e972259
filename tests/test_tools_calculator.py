"""The `calculate` built-in: exact, whitelisted, bounded arithmetic."""

import operator
import string
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tools import ToolContext
from tools.builtin import calculator
from tools.builtin.calculator import CalculationError, calculate, evaluate, format_number
from tools.execute import execute


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1999 + 2999", "4998"),
        ("(1999 + 2999) * 1.18", "5897.64"),
        ("0.1 + 0.2", "0.3"),
        ("10 / 4", "2.5"),
        ("-5 / 4", "-1.25"),
        ("2 ** -3", "0.125"),
        ("1 / 3", "1/3 ≈ 0.333333333333"),
        ("-2 / 3", "-2/3 ≈ -0.666666666667"),
        ("7 // 2", "3"),
        ("-7 % 3", "2"),
        ("-2 ** 2", "-4"),
        ("(-2) ** 2", "4"),
        ("+-+1", "-1"),
        ("1_000 * 3", "3000"),
        ("1.5e3 + .5", "1500.5"),
        ("  2 *\n 3 ", "6"),
        ("1 / 7 * 1e-30", "1/7000000000000000000000000000000 ≈ 1.42857142857e-31"),
        ("10 ** 40 / 3", "10000000000000000000000000000000000000000/3 ≈ 3.33333333333e+39"),
        ("0.000001 / 3", "1/3000000 ≈ 3.33333333333e-7"),
        ("2 ** 64", "18446744073709551616"),
        ("(" * 150 + "1" + ")" * 150, "1"),
        ("1 / 30000", "1/30000 ≈ 0.0000333333333333"),
    ],
)
def test_results_are_exact_and_formatted(expression: str, expected: str) -> None:
    assert calculate(expression) == expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("1 / 0", "division by zero"),
        ("1 // (2 - 2)", "division by zero"),
        ("5 % 0.0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("x + 1", "names such as 'x' are not allowed"),
        ("abs(-1)", "function calls are not allowed"),
        ("(1).real", "attributes are not allowed"),
        ("__import__('os')", "function calls are not allowed"),
        ("2 ^ 3", "use ** for powers"),
        ("~1", "the operator ~ is not supported"),
        ("1 < 2", "Compare expressions are not supported"),
        ("'a' * 3", "only numbers are allowed"),
        ("True + 1", "only numbers are allowed"),
        ("1j", "only numbers are allowed"),
        ("[1, 2]", "List expressions are not supported"),
        ("1 +", "not a valid arithmetic expression"),
        ("", "the expression is empty"),
        ("1" + " + 1" * 200, "the expression is too long (801 characters; the limit is 500)"),
        ("2 ** 0.5", "fractional exponents are not supported"),
        ("2 ** 1001", "the exponent 1001 is too large"),
        ("9 ** 9 ** 9", "the exponent 387420489 is too large"),
        ("(10 ** 1000) ** 11", "more than 10,000 digits"),
        (
            "10 ** 1000 * 10 ** 1000 * 10 ** 1000 * 10 ** 1000 * 10 ** 1000 * 10 ** 1000 "
            "* 10 ** 1000 * 10 ** 1000 * 10 ** 1000 * 10 ** 1000",
            "more than 10,000 digits",
        ),
        ("1e99999999", "too large or too small"),
        ("1e-10001", "too large or too small"),
        ("-" * 300 + "1", "nested too deeply"),
    ],
)
def test_refusals_say_why(expression: str, message: str) -> None:
    with pytest.raises(CalculationError) as caught:
        calculate(expression)
    assert message in str(caught.value)


def test_a_result_of_exactly_the_digit_limit_is_allowed() -> None:
    assert calculate(
        "10 ** 1000 * 10 ** 1000 * 10 ** 1000 * 10 ** 1000 * 10 ** 999 "
        "* 10 ** 1000 * 10 ** 1000 * 10 ** 1000 * 10 ** 1000 * 10 ** 1000 - 1"
    ) == ("9" * 9_999)


def test_the_tool_reports_errors_as_observations() -> None:
    tool = calculator.TOOLS[0]
    assert tool.name == "calculate" and tool.effect == "read" and tool.strict
    ctx = ToolContext(user_id="U1")
    assert execute(tool, ctx, {"expression": "1999 + 2999"}).text == "4998"
    failed = execute(tool, ctx, {"expression": "1/0"})
    assert not failed.ok
    assert (
        failed.text == "Error: CalculationError: division by zero (/ with a zero right-hand side)"
    )


# -- properties --------------------------------------------------------------------

OPERATORS: dict[str, Callable[[Fraction, Fraction], Fraction | int]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "%": operator.mod,
}

integers = st.integers(min_value=0, max_value=10**6).map(lambda n: (str(n), Fraction(n)))
decimals = st.decimals(min_value=0, max_value=10**6, places=3, allow_nan=False).map(
    lambda d: (str(d), Fraction(d))
)
leaves = st.one_of(integers, decimals)


def combine(children: st.SearchStrategy[tuple[str, Fraction | None]]) -> st.SearchStrategy:
    binary = st.tuples(children, st.sampled_from(sorted(OPERATORS)), children).map(_binary)
    negate = children.map(lambda c: (f"(-{c[0]})", None if c[1] is None else -c[1]))
    powers = st.tuples(children, st.integers(min_value=-3, max_value=3)).map(_power)
    return st.one_of(binary, negate, powers)


def _binary(parts: tuple) -> tuple[str, Fraction | None]:
    (left_text, left), symbol, (right_text, right) = parts
    text = f"({left_text} {symbol} {right_text})"
    if left is None or right is None:
        return text, None
    try:
        return text, Fraction(OPERATORS[symbol](left, right))
    except ZeroDivisionError:
        return text, None


def _power(parts: tuple) -> tuple[str, Fraction | None]:
    (base_text, base), exponent = parts
    text = f"({base_text} ** {exponent})"
    if base is None or (base == 0 and exponent < 0):
        return text, None
    return text, Fraction(base**exponent)


expressions = st.recursive(leaves, combine, max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(case=expressions)
def test_matches_fraction_arithmetic(case: tuple[str, Fraction | None]) -> None:
    text, expected = case
    if expected is None:
        with pytest.raises(CalculationError, match="division by zero"):
            evaluate(text)
        return
    try:
        assert evaluate(text) == expected
    except CalculationError as error:  # only the size limits may refuse a valid expression
        assert "too long" in str(error) or "digits" in str(error)


@settings(max_examples=300, deadline=None)
@given(
    value=st.fractions(max_denominator=10**12).filter(lambda f: abs(f) < 10**30)
    | st.integers(min_value=-(10**50), max_value=10**50).map(Fraction)
)
def test_formatting_round_trips(value: Fraction) -> None:
    text = format_number(value)
    exact, _, approximate = text.partition(" ≈ ")
    assert Fraction(exact) == value
    if value.denominator == 1:
        assert exact == str(value.numerator)
    if approximate:
        assert "/" in exact
        assert abs(
            Decimal(approximate) - Decimal(value.numerator) / Decimal(value.denominator)
        ) <= (abs(Decimal(approximate)) * Decimal("1e-11"))
    else:
        assert "/" not in exact


calculator_text = st.text(alphabet=string.digits + "+-*/%().eE_ jx^,'abs[]~<>=" + "\n", max_size=80)


@settings(max_examples=500, deadline=None)
@given(expression=st.one_of(calculator_text, st.text(max_size=60)))
def test_any_text_gives_a_result_or_a_calculation_error(expression: str) -> None:
    try:
        result = calculate(expression)
    except CalculationError as error:
        assert str(error)
    else:
        assert isinstance(result, str) and result
