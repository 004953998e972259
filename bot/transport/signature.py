"""Slack's request signature, checked on the raw body before anything reads it.

Slack sends `X-Slack-Request-Timestamp: <unix seconds>` and
`X-Slack-Signature: v0=<hex HMAC-SHA256 of "v0:{timestamp}:{body}" with the signing secret>`.
A timestamp more than five minutes from now is refused (a replayed request). A header that
is missing, sent twice, or not of exactly that shape is a refusal too, never an exception:
slack_sdk's verifier calls `int()` on the timestamp and raises on "abc", which reached Slack
(or an attacker) as HTTP 500 with a traceback in our logs (issue 15, item 8).

While a signing secret is being rotated, requests signed with any of the configured secrets
are accepted (`SLACK_SIGNING_SECRET`, then `SLACK_SIGNING_SECRET_PREVIOUS`); at most
`MAX_SECRETS`, so a request costs a bounded number of HMACs.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Sequence

MAX_SKEW = 300  # seconds; Slack's own rule (slack_sdk.signature)
MAX_SECRETS = 4  # the current one and up to three previous ones
_TIMESTAMP = re.compile(r"[0-9]{1,12}")  # ASCII digits only (`\d` would take "١٢٣")
_SIGNATURE = re.compile(r"v0=[0-9a-f]{64}")


def problem(
    secrets: str | Sequence[str],
    timestamps: Sequence[str],
    signatures: Sequence[str],
    body: bytes,
    now: float | None = None,
) -> str | None:
    """Why the request is not signed by Slack with `secrets` (one, or any of several), or
    None when it is.

    `timestamps` and `signatures` are every value the request sent for each header (so a
    header sent twice is seen, not silently reduced to one of its values)."""
    candidates = (secrets,) if isinstance(secrets, str) else tuple(secrets)
    candidates = tuple(s for s in candidates if s)[:MAX_SECRETS]
    if not candidates:
        return "no signing secret configured"
    if len(timestamps) != 1 or len(signatures) != 1:
        return "missing or repeated signature headers"
    timestamp, signature = timestamps[0].strip(), signatures[0].strip()
    if not _TIMESTAMP.fullmatch(timestamp):
        return "malformed timestamp"
    if not _SIGNATURE.fullmatch(signature):
        return "malformed signature"
    if abs((time.time() if now is None else now) - int(timestamp)) > MAX_SKEW:
        return "stale timestamp"
    if not any(hmac.compare_digest(sign(s, timestamp, body), signature) for s in candidates):
        return "wrong signature"
    return None


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The `X-Slack-Signature` value Slack would send for `body` at `timestamp`."""
    message = b"v0:" + timestamp.encode("ascii") + b":" + body
    return "v0=" + hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()
