"""Shell-style tool name patterns in the policy file (`"git_*"`), and which of several
patterns that match a tool applies to it: the most specific one."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

GLOB_CHARS = frozenset("*?[")


def is_pattern(key: str) -> bool:
    """Is this `tools:` key a shell-style pattern ("git_*") rather than a tool name?"""
    return not GLOB_CHARS.isdisjoint(key)


def pattern_matches(pattern: str, name: str) -> bool:
    """Does a tool name match a `tools:` pattern? Case-sensitive, like tool names."""
    return fnmatch.fnmatchcase(name, pattern)


def specificity(pattern: str) -> tuple[int, int, int]:
    """How specific a pattern is; the larger tuple wins. In order of importance:

    1. the length of its literal prefix (the characters before the first `*`, `?` or
       `[...]`): "git_diff*" (8) beats "git_*" (4) beats "*_status" (0);
    2. the number of literal characters anywhere: "git_*_log" (7) beats "git_*" (4);
    3. fewer wildcards: "git_*" beats "git_*?*".

    A `[...]` class counts as a wildcard, as `*` and `?` do; a `[` without its `]` is a
    literal character, as in `fnmatch`.
    """
    prefix: int | None = None
    literals = wildcards = 0
    for token in _glob_tokens(pattern):
        if token in ("*", "?") or (len(token) > 1 and token.startswith("[")):
            wildcards += 1
            if prefix is None:
                prefix = literals
        else:
            literals += 1
    return (literals if prefix is None else prefix, literals, -wildcards)


def most_specific(patterns: Iterable[str], name: str) -> str | None:
    """The pattern that applies to `name`: the most specific one that matches (the first
    of equals, which a loaded policy never has); None when none matches."""
    best: str | None = None
    for pattern in patterns:
        if pattern_matches(pattern, name) and (
            best is None or specificity(pattern) > specificity(best)
        ):
            best = pattern
    return best


def _glob_tokens(pattern: str) -> list[str]:
    """Split a pattern as `fnmatch` reads it: `*`, `?`, whole `[...]` classes, characters."""
    tokens: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        char = pattern[i]
        if char == "[":
            j = i + 1
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j < n:  # a whole class
                tokens.append(pattern[i : j + 1])
                i = j + 1
                continue
        tokens.append(char)
        i += 1
    return tokens
