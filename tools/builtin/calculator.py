"""`calculate`: exact arithmetic on a small, bounded expression language.

Numbers (integers and decimals), + - * / // % **, unary + and -, and
parentheses. Evaluated with `fractions.Fraction`, so 0.1 + 0.2 is exactly 0.3.
Names, calls, attributes and everything else are refused, and sizes are
checked *before* anything expensive is computed.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from decimal import Context, Decimal
from fractions import Fraction

from tools.declare import make_tool

MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 1000
MAX_DIGITS = 10_000
MAX_DEPTH = 100
ROUNDED_DIGITS = 12

_LOG10_2 = math.log10(2)
_DECIMAL_LITERAL = re.compile(r"^(\d*)\.?(\d*)(?:[eE]([+-]?\d+))?$")

_BINARY: dict[type[ast.operator], tuple[str, Callable[[Fraction, Fraction], Fraction | int]]] = {
    ast.Add: ("+", operator.add),
    ast.Sub: ("-", operator.sub),
    ast.Mult: ("*", operator.mul),
    ast.Div: ("/", operator.truediv),
    ast.FloorDiv: ("//", operator.floordiv),
    ast.Mod: ("%", operator.mod),
}
_SYMBOLS: dict[type[ast.AST], str] = {
    ast.BitXor: "^ (use ** for powers)",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.MatMult: "@",
    ast.Invert: "~",
    ast.Not: "not",
}


class CalculationError(ValueError):
    """The expression cannot be evaluated; the message says why."""


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return the result.

    Supports numbers (integers and decimals), + - * / // % ** and parentheses.
    Results are exact: whole numbers as integers, terminating decimals as
    decimals, otherwise a fraction with a rounded decimal.

    Args:
        expression: The arithmetic to evaluate, e.g. "(1999 + 2999) * 1.18".
    """
    return format_number(evaluate(expression))


def evaluate(expression: str) -> Fraction:
    """The exact value of `expression`; raises CalculationError."""
    text = " ".join(expression.split())  # newlines and tabs would be syntax errors
    if not text:
        raise CalculationError("the expression is empty")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculationError(
            f"the expression is too long ({len(text)} characters; the limit is "
            f"{MAX_EXPRESSION_CHARS})"
        )
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as error:
        raise CalculationError(f"not a valid arithmetic expression ({_reason(error)})") from None
    return _Evaluator(text).value(tree.body, 0)


def format_number(value: Fraction) -> str:
    """Integers as "4998", terminating decimals as "0.125", else "1/3 ≈ 0.333333333333"."""
    if value.denominator == 1:
        return int_text(value.numerator)
    places = _decimal_places(value.denominator)
    if places is not None and places <= MAX_DIGITS:
        scaled = abs(value.numerator) * 10**places // value.denominator
        digits = int_text(scaled).rjust(places + 1, "0")
        sign = "-" if value < 0 else ""
        return f"{sign}{digits[:-places]}.{digits[-places:]}"
    fraction = f"{int_text(value.numerator)}/{int_text(value.denominator)}"
    return f"{fraction} ≈ {rounded(value)}"


def rounded(value: Fraction, digits: int = ROUNDED_DIGITS) -> str:
    """`value` rounded to `digits` significant digits, in plain or scientific notation."""
    context = Context(prec=digits)
    quotient = context.divide(Decimal(value.numerator), Decimal(value.denominator))
    if -5 <= quotient.adjusted() < digits:
        return _trim(format(quotient, "f"))
    mantissa, _, exponent = format(quotient, "e").partition("e")
    return f"{_trim(mantissa)}e{exponent}"


def int_text(number: int) -> str:
    """str(int) without CPython's 4,300-digit conversion limit (results may be larger)."""
    if number < 0:
        return "-" + int_text(-number)
    if number.bit_length() < 10_000:
        return str(number)
    half = (len_estimate(number) // 2) or 1
    high, low = divmod(number, 10**half)
    return int_text(high) + int_text(low).rjust(half, "0")


def len_estimate(number: int) -> int:
    """An upper bound on the count of decimal digits of `number` (off by at most one)."""
    return int(abs(number).bit_length() * _LOG10_2) + 1


class _Evaluator:
    def __init__(self, source: str) -> None:
        self.source = source

    def value(self, node: ast.expr, depth: int) -> Fraction:
        if depth > MAX_DEPTH:
            raise CalculationError("the expression is nested too deeply")
        if isinstance(node, ast.Constant):
            return self.constant(node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
            operand = self.value(node.operand, depth + 1)
            return operand if isinstance(node.op, ast.UAdd) else -operand
        if isinstance(node, ast.BinOp):
            left = self.value(node.left, depth + 1)
            right = self.value(node.right, depth + 1)
            return binary(node.op, left, right)
        raise CalculationError(_refusal(node))

    def constant(self, node: ast.Constant) -> Fraction:
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CalculationError(f"only numbers are allowed, not {type(value).__name__} values")
        if isinstance(value, int):
            return Fraction(value)
        literal = (ast.get_source_segment(self.source, node) or repr(value)).replace("_", "")
        return decimal_literal(literal)


def decimal_literal(literal: str) -> Fraction:
    """The exact value of a decimal literal such as "0.1" or "1.5e3", size-checked first."""
    match = _DECIMAL_LITERAL.match(literal)
    if not match:
        raise CalculationError(f"{literal[:40]!r} is not a decimal number")
    whole, fraction, exponent = match.group(1), match.group(2), int(match.group(3) or 0)
    if abs(exponent) > MAX_DIGITS:
        raise CalculationError(f"the number {literal[:40]} is too large or too small")
    _check_digits(len(whole) + len(fraction) + abs(exponent))
    return Fraction(literal)


def binary(op: ast.operator, left: Fraction, right: Fraction) -> Fraction:
    """Apply one binary operator exactly, refusing results beyond the digit limit."""
    if isinstance(op, ast.Pow):
        return power(left, right)
    entry = _BINARY.get(type(op))
    if entry is None:
        raise CalculationError(_unsupported(op))
    symbol, apply = entry
    if isinstance(op, ast.Div | ast.FloorDiv | ast.Mod) and right == 0:
        raise CalculationError(f"division by zero ({symbol} with a zero right-hand side)")
    result = Fraction(apply(left, right))
    _check_size(result)
    return result


def power(base: Fraction, exponent: Fraction) -> Fraction:
    """base ** exponent for a whole exponent with |exponent| <= 1000, size-checked first."""
    if exponent.denominator != 1:
        raise CalculationError(
            "fractional exponents are not supported (the result could be irrational)"
        )
    whole = exponent.numerator
    if abs(whole) > MAX_EXPONENT:
        raise CalculationError(f"the exponent {whole} is too large (the limit is ±{MAX_EXPONENT})")
    if base == 0 and whole < 0:
        raise CalculationError("division by zero (0 raised to a negative power)")
    largest = max(abs(base.numerator).bit_length(), base.denominator.bit_length())
    _check_digits(int((largest - 1) * abs(whole) * _LOG10_2))  # a lower bound on the result
    result = base**whole
    assert isinstance(result, Fraction)
    _check_size(result)
    return result


def _check_size(value: Fraction) -> None:
    _check_digits(max(digit_count(value.numerator), digit_count(value.denominator)))


def digit_count(number: int) -> int:
    """The exact number of decimal digits of `number` (0 has one digit)."""
    estimate = len_estimate(number)
    if estimate <= 1:
        return 1
    return estimate if abs(number) >= 10 ** (estimate - 1) else estimate - 1


def _check_digits(digits: int) -> None:
    if digits > MAX_DIGITS:
        raise CalculationError(f"the result would have more than {MAX_DIGITS:,} digits")


def _decimal_places(denominator: int) -> int | None:
    """Digits after the point if 1/denominator terminates in decimal, else None."""
    twos = (denominator & -denominator).bit_length() - 1
    rest = denominator >> twos
    fives = 0
    while rest % 5 == 0:
        rest //= 5
        fives += 1
    return max(twos, fives) if rest == 1 else None


def _trim(text: str) -> str:
    return text.rstrip("0").rstrip(".") if "." in text else text


def _reason(error: BaseException) -> str:
    if isinstance(error, SyntaxError) and error.msg:
        return error.msg
    return type(error).__name__


def _refusal(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return f"names such as {node.id[:40]!r} are not allowed; use numbers only"
    if isinstance(node, ast.Call):
        return "function calls are not allowed; use + - * / // % ** and parentheses"
    if isinstance(node, ast.Attribute):
        return "attributes are not allowed; use numbers only"
    if isinstance(node, ast.UnaryOp):
        return _unsupported(node.op)
    kind = type(node).__name__
    return f"{kind} expressions are not supported; use + - * / // % ** and parentheses"


def _unsupported(op: ast.operator | ast.unaryop) -> str:
    return f"the operator {_SYMBOLS.get(type(op), type(op).__name__)} is not supported"


TOOLS = (make_tool(calculate, effect="read", timeout=2.0),)
