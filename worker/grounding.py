"""Grounding check: every number in an answer must come from a tool result or the question."""

from __future__ import annotations

import re
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation

# 4998, 4,998, 1 999 (thin grouping is not handled), 12.50, -3, 7%, $2,999.00
_NUMBER = re.compile(
    r"(?<![\w.])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w])|(?<![\w.])-?\d+(?:\.\d+)?(?![\w])"
)
SMALL = 10  # 0..10 are list markers and counting words as often as figures; not checked


def numbers(text: str) -> set[Decimal]:
    found: set[Decimal] = set()
    for match in _NUMBER.finditer(text):
        raw = match.group(0).replace(",", "")
        try:
            found.add(Decimal(raw).normalize())
        except InvalidOperation:
            continue
    return found


def untraceable(answer: str, sources: Iterable[str]) -> list[str]:
    """Numbers in `answer` that appear in none of `sources`, as written in the answer."""
    known: set[Decimal] = set()
    for source in sources:
        known |= numbers(source)
    flagged: list[str] = []
    for match in _NUMBER.finditer(answer):
        written = match.group(0)
        try:
            value = Decimal(written.replace(",", "")).normalize()
        except InvalidOperation:
            continue
        if abs(value) <= SMALL and value == value.to_integral_value():
            continue
        if value not in known and abs(value) not in known and written not in flagged:
            flagged.append(written)
    return flagged
