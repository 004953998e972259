"""Grounding check: the facts an answer states must come from a tool result, the question, or
what the operator wrote (instructions, the offered tools' descriptions).

Facts are what a reader takes for looked up: numbers and prices, identifiers (ticket keys
such as IT-123, references such as #41, order ids, e-mail addresses), quoted text and proper
names of two or more words ("Django Fundamentals", "Amazon Web Services"). Conservative on
purpose: a fact counts as found when it appears in any source in any of the forms below, so
an answer is flagged only for what no source has at all.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from collections.abc import Iterable, Iterator
from decimal import Decimal, InvalidOperation
from typing import Any

from worker.run import Grounding

MAX_TEXT = 200_000  # characters of an answer or of all sources read; the rest is not checked
MAX_FACTS = 50  # facts of each kind reported

# 4998, 4,998, 1 999 (thin grouping is not handled), 12.50, -3, 7%, $2,999.00
_NUMBER = re.compile(
    r"(?<![\w.])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w])|(?<![\w.])-?\d+(?:\.\d+)?(?![\w])"
)
SMALL = 10  # 0..10 are list markers and counting words as often as figures; not checked
# ... unless they are prices: a currency sign or code right before or after the figure
_CURRENCY_BEFORE = re.compile(r"(?:[$€£¥₹]|\b(?:USD|EUR|GBP|INR|JPY|CHF|CAD|AUD|Rs\.?))\s?$")
_CURRENCY_AFTER = re.compile(r"^\s?(?:USD|EUR|GBP|INR|JPY|CHF|CAD|AUD|dollars?|euros?|rupees)\b")

# Tokens that carry an id: letters and digits together (IT-123, ORD-2024-0042, A1B2C3, a run
# id), a reference (#41), an e-mail address. Not: 3rd, 10am, 24h, 5GB (a figure and its unit).
_TOKEN = re.compile(r"(?<![\w@.-])[A-Za-z0-9][A-Za-z0-9_-]*[A-Za-z0-9](?![\w@-])")
_KEY = re.compile(r"^([A-Za-z][A-Za-z0-9]*)[-_](\d+)$")  # a project key and a number
_UNIT = re.compile(r"^\d+(?:[.,]\d+)?[A-Za-z]{1,3}$")
_REFERENCE = re.compile(r"(?<![\w&#])#(\d+)\b")
_EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")

# Quoted text (straight and curly double quotes) and runs of capitalised words.
_QUOTED = re.compile(r"\"([^\"\n]{2,120})\"|“([^”\n]{2,120})”")
_WORD = r"(?:[A-Z][a-z0-9]+(?:-[A-Z]?[a-z0-9]+)*|[A-Z]{2,}[a-z]{0,2}|[A-Z][a-z]*[A-Z][A-Za-z]*)"
_CONNECTOR = r"(?:of|with|for|the|de|von|van|du|la|le)"
_NAME = re.compile(rf"\b{_WORD}(?:[ \t]+(?:{_CONNECTOR}[ \t]+)?{_WORD})+\b")
# Capitalised because a sentence starts with them, not because they are names.
_OPENING_WORDS = (
    "a an and any are as at but by can could did do does for from have here hi hello how "
    "i one two three four five six seven eight nine ten if in is it its my no not now of "
    "ok okay on or our please since so sorry sure than thanks that the their then there "
    "these they this those to too unfortunately we what when where which while who why "
    "will with yes you your"
)
_OPENERS = frozenset(_OPENING_WORDS.split())
_SPACE = re.compile(r"\s+")
_SENTENCE_END = re.compile(r"[.!?:;\n•*>(\[-][\s*_\"“(]*$")


def numbers(text: str) -> set[Decimal]:
    found: set[Decimal] = set()
    for match in _NUMBER.finditer(text):
        value = _decimal(match.group(0))
        if value is not None:
            found.add(value)
    return found


def _decimal(written: str) -> Decimal | None:
    try:
        return Decimal(written.replace(",", "")).normalize()
    except InvalidOperation:
        return None


def untraceable(answer: str, sources: Iterable[str]) -> list[str]:
    """Numbers in `answer` that appear in none of `sources`, as written in the answer."""
    return check(answer, sources).numbers


def check(answer: str, sources: Iterable[str], standing: Iterable[str] = ()) -> Grounding:
    """Every fact in `answer` that none of `sources` and `standing` has (see the module's
    docstring). `standing` are the sources every run has (the operator's instructions, the
    offered tools' descriptions): what they hold is read once and kept."""
    answer = answer[:MAX_TEXT]
    known = Known(sources, standing)
    identifiers: dict[str, None] = {}  # in the order found, once each
    pieces: list[str] = []  # the answer with its identifiers blanked: their digits are no figures
    at = 0
    for start, end, written, found in sorted(_identifiers(answer, known)):
        if start < at:
            continue
        pieces += [answer[at:start], " " * (end - start)]
        at = end
        if not found:
            identifiers[written] = None
    masked = "".join([*pieces, answer[at:]])
    flagged: list[str] = []
    for match in _NUMBER.finditer(masked):
        written = match.group(0)
        value = _decimal(written)
        if value is None:
            continue
        price = _CURRENCY_BEFORE.search(masked[max(0, match.start() - 4) : match.start()]) or (
            _CURRENCY_AFTER.match(masked[match.end() : match.end() + 9])
        )
        if abs(value) <= SMALL and value == value.to_integral_value() and not price:
            continue
        found = known.has_number(value) or known.has_number(abs(value))
        if not found and written not in flagged:
            flagged.append(written)
            if len(flagged) >= MAX_FACTS:
                break
    return Grounding(
        numbers=flagged,
        identifiers=list(identifiers)[:MAX_FACTS],
        names=list(itertools.islice(_names(answer, masked, known), MAX_FACTS)),
    )


class Known:
    """What the sources say, in the forms an answer is compared with: a run's own sources,
    read at each check, and each standing one's, read once and kept (`_standing`)."""

    def __init__(self, sources: Iterable[str], standing: Iterable[str] = ()) -> None:
        budget = MAX_TEXT
        own: list[str] = []
        kept: list[str] = []
        for source, is_standing in itertools.chain(
            zip(sources, itertools.repeat(False)), zip(standing, itertools.repeat(True))
        ):
            if budget <= 0:
                break
            source = source[:budget]
            budget -= len(source)
            (kept if is_standing and len(source) <= KEPT_CHARS else own).append(source)
        read = _Merged(f for text in own for f in _read_facts(text))
        self.layers = (read, *(_standing(text) for text in kept))

    def has_number(self, value: Decimal | None) -> bool:
        return any(value in layer.numbers for layer in self.layers)

    def has_token(self, written: str) -> bool:
        folded = written.casefold()
        return any(folded in layer.tokens for layer in self.layers)

    def has_key(self, prefix: str, number: str) -> bool:
        """IT-41 for ticket 41 of project IT: both in one source, as words."""
        word, value = prefix.casefold(), _decimal(number)
        return any(
            word in tokens and value in found
            for layer in self.layers
            for tokens, found in layer.each
        )

    def has_phrase(self, phrase: str) -> bool:
        wanted = _normal(phrase)
        if self._said(wanted):
            return True
        parts = [p for p in re.split(rf"\s+{_CONNECTOR}\s+", wanted) if p]
        return len(parts) > 1 and all(self._said(p) for p in parts)

    def _said(self, normal: str) -> bool:
        # no source's text spans two (joined by " \n ", which no normalised phrase holds)
        return any(normal in layer.phrases for layer in self.layers)


class _Merged:
    """The facts of some texts together: their numbers and tokens, each text's own (for
    keys), their normalised texts joined. Not changed once made (a standing source's is
    every run's)."""

    __slots__ = ("each", "numbers", "phrases", "tokens")

    def __init__(self, facts: Iterable[_Facts]) -> None:
        numbers: set[Decimal] = set()
        tokens: set[str] = set()
        each: list[tuple[frozenset[str], frozenset[Decimal]]] = []  # for keys such as IT-41
        phrases: list[str] = []
        for found in facts:
            each.append((found.tokens, found.numbers))
            numbers |= found.numbers
            tokens |= found.tokens | found.emails
            phrases.append(found.normal)
        self.numbers, self.tokens, self.each = frozenset(numbers), frozenset(tokens), tuple(each)
        self.phrases = " \n ".join(phrases)


class _Facts:
    """What one source text holds, in the forms `Known` compares with."""

    __slots__ = ("emails", "normal", "numbers", "tokens")

    def __init__(self, text: str) -> None:
        self.numbers = frozenset(numbers(text))
        self.tokens = frozenset(t.casefold() for t in _TOKEN.findall(text))
        self.emails = frozenset(e.casefold() for e in _EMAIL.findall(text))
        self.normal = _normal(text)


def _read_facts(source: str) -> tuple[_Facts, ...]:
    """The facts of a source and of each string in it when it is JSON (a tool result's
    values, unescaped). A text without a backslash escapes nothing: each of its strings is
    in it as written, between quotes (which bound a token, a figure or an address as the
    string's own ends do), so their facts are the text's already and are not read again
    (most tool results; a fee run's check 200 -> 131 us)."""
    if "\\" not in source:
        return (_Facts(source),)
    return tuple(_Facts(text) for text in (source, *_json_strings(source)))


# Each standing source's facts, kept, and merged: reading them again at every run was most
# of a run's grounding check, and merging them into the run's (their sets' unions) at every
# run was 78 of a check's 260 us (the built-in tools' list; profiled in a worker at 1,000
# slots: the check 5 % of its CPU); they are looked up beside the run's own instead. Kept
# per text, as profiles' instructions and roles' tool lists combine. Bounded: 8 texts of
# at most 64,000 characters (~2.4 MiB of facts each at the ~38 bytes per character
# measured for a JSON document; instructions and tool lists are a few thousand
# characters); a longer one is read at each check, as a run's own sources are.
KEPT_SOURCES, KEPT_CHARS = 8, 64_000


@functools.lru_cache(maxsize=KEPT_SOURCES)
def _standing(text: str) -> _Merged:
    return _Merged(_read_facts(text))


def _identifiers(answer: str, known: Known) -> Iterator[tuple[int, int, str, bool]]:
    """(start, end, as written, found in a source) of each identifier in `answer`."""
    for match in _EMAIL.finditer(answer):
        yield *match.span(), match.group(0), known.has_token(match.group(0))
    for match in _REFERENCE.finditer(answer):
        yield *match.span(), match.group(0), known.has_number(_decimal(match.group(1)))
    without_emails = _EMAIL.sub(lambda m: " " * len(m.group(0)), answer)
    for match in _TOKEN.finditer(without_emails):
        written = match.group(0)
        if not _is_identifier(written):
            continue
        key = _KEY.match(written)
        found = known.has_token(written) or bool(key and known.has_key(*key.groups()))
        yield *match.span(), written, found


def _is_identifier(token: str) -> bool:
    digits = sum(ch.isdigit() for ch in token)
    letters = sum(ch.isalpha() for ch in token)
    if not digits or not letters or _UNIT.match(token):
        return False
    if _KEY.match(token) and token[0].isupper():
        return True  # IT-7, HR_12
    return digits >= 2 and len(token) >= 5


def _names(answer: str, masked: str, known: Known) -> Iterator[str]:
    """Quoted text of `answer`, and the proper names of `masked` (the answer without its
    identifiers: the ORD of ORD-2024-0042 is no name), that no source has. A sentence's first
    word is capitalised anyway: without it, the rest must be a name no source has too
    ("Closed HR ticket" names nothing, "Python Basics has" is not checked on its own)."""
    seen: set[str] = set()
    for match in _QUOTED.finditer(answer):
        quoted = (match.group(1) or match.group(2) or "").strip()
        if quoted and quoted not in seen and not known.has_phrase(quoted):
            seen.add(quoted)
            yield quoted
    for match in _NAME.finditer(masked):
        words = match.group(0).split()
        opening = _opens_sentence(masked, match.start())
        while words and words[0].casefold() in _OPENERS:
            words, opening = words[1:], False
        name = " ".join(words)
        if len(words) < 2 or name in seen or name.isupper() or known.has_phrase(name):
            continue
        rest = words[1:] if opening else words
        if len(rest) >= 2 and not known.has_phrase(" ".join(rest)):
            seen.add(name)
            yield name


def _opens_sentence(text: str, at: int) -> bool:
    before = text[max(0, at - 12) : at]
    return (at <= 12 and not before.strip(' \t*_"“(')) or bool(_SENTENCE_END.search(before))


def _normal(text: str) -> str:
    return _SPACE.sub(" ", text.casefold()).strip(" .,:;!?*_\"'`“”")


def _json_strings(text: str) -> list[str]:
    """The strings in `text` when it is a JSON document, each as its own text."""
    if text[:1] not in ("{", "["):
        return []
    try:
        data = json.loads(text)
    except ValueError:
        return []
    out: list[str] = []
    _walk(data, out, depth=0)
    return out


def _walk(value: Any, out: list[str], depth: int) -> None:
    if depth > 20 or len(out) > 5000:
        return
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for item in value.values():
            _walk(item, out, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _walk(item, out, depth + 1)
