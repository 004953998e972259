"""Secrets out of anything recorded: keys that name a credential, and values that look like one.

Used by the structured logs (switchboard/logs.py: by key) and by the traces (worker/tracing.py:
by key and by value, since a span may carry a prompt, a tool's arguments or its result, where
a token can turn up in any text)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

REDACTED = "[redacted]"

# A key naming one of these holds a credential, whatever its value looks like.
SECRET_KEYS = ("token", "secret", "api_key", "authorization", "password")

# Values that are credentials by their shape: Slack tokens (xoxb-, xoxp-, xapp-, xoxe.…),
# OpenAI-style keys (sk-…), bearer credentials, JWTs, a URL's user:password@, and
# `key=value` pairs whose key names a secret.
_SHAPES = re.compile(
    r"(?:xox[a-z]?(?:\.xox[a-z])?-[A-Za-z0-9-]{6,}"
    r"|xapp-[A-Za-z0-9-]{6,}"
    r"|\bsk-[A-Za-z0-9_-]{12,}"
    r"|(?i:bearer)\s+[A-Za-z0-9._~+/=-]{8,}"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"
    r"|(?<=://)[^/\s:@]+:[^/\s@]+(?=@)"
    r"|(?i:(?:api[_-]?key|token|secret|password|passwd)\s*[=:]\s*)[^\s,;&\"']{4,})"
)


def secret_key(key: str) -> bool:
    lowered = key.lower()
    return any(part in lowered for part in SECRET_KEYS)


def redact_text(text: str, known: Iterable[str] = ()) -> str:
    """`text` with every credential-shaped value, and every one of the `known` secret values
    (the process's own tokens), replaced by [redacted]."""
    for value in known:
        if value and len(value) >= 6 and value in text:
            text = text.replace(value, REDACTED)
    return _SHAPES.sub(_keep_key, text)


def _keep_key(match: re.Match[str]) -> str:
    found = match.group(0)
    key = re.match(r"(?i)(?:api[_-]?key|token|secret|password|passwd)\s*[=:]\s*", found)
    return (key.group(0) if key else "") + REDACTED


def redact_value(value: Any, known: Iterable[str] = (), depth: int = 0) -> Any:
    """A JSON-like value with secret-named keys' values and credential-shaped text redacted;
    nested deeper than 20 levels is cut (bounded work on any input)."""
    known = tuple(known)
    if depth > 20:
        return "[too deep]"
    if isinstance(value, str):
        return redact_text(value, known)
    if isinstance(value, dict):
        return {
            str(k): REDACTED if secret_key(str(k)) else redact_value(v, known, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_value(v, known, depth + 1) for v in value]
    return value
