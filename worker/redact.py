"""Secrets out of anything recorded: keys that name a credential.

Used by the structured logs (switchboard/logs.py)."""

from __future__ import annotations

REDACTED = "[redacted]"

# A key naming one of these holds a credential, whatever its value looks like.
SECRET_KEYS = ("token", "secret", "api_key", "authorization", "password")


def secret_key(key: str) -> bool:
    lowered = key.lower()
    return any(part in lowered for part in SECRET_KEYS)
