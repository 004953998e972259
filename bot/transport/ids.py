"""The shapes of the ids the bot reads from Slack's payloads and from its own buttons.

A value is used only when it is a string that matches its shape in full (`re.fullmatch`:
`$` alone would let a trailing newline through), so a malformed payload is dropped before
anything is stored, mentioned or looked up.
"""

from __future__ import annotations

import re
from typing import Any

USER = re.compile(r"[UW][A-Z0-9]{1,20}")
CHANNEL = re.compile(r"[CGD][A-Z0-9]{1,20}")
TS = re.compile(r"[0-9]{1,12}\.[0-9]{1,9}")  # a message ts: "1700000000.000100"
EVENT = re.compile(r"Ev[A-Za-z0-9]{1,60}")
TRIGGER = re.compile(r"[A-Za-z0-9.]{1,200}")
VIEW = re.compile(r"V[A-Z0-9]{1,20}")
RUN = re.compile(r"r[0-9a-f]{8,40}")
APPROVAL = re.compile(r"ap_[0-9a-f]{8,64}")
BATCH = re.compile(r"bt_[0-9a-f]{20}")


def shaped(pattern: re.Pattern[str], value: Any) -> str | None:
    """`value` when it is a string of the pattern's shape, else None."""
    if isinstance(value, str) and pattern.fullmatch(value):
        return value
    return None


GRANT = re.compile(r"gr_[0-9a-f]{20}")
