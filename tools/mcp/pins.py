"""The first listing of each MCP server, fixed for the deployment, so a server cannot change
what its tools are under the operator.

Every process (the bot, each worker, `switchboard tools`) lists each server itself at
start-up, and an annotation is what makes a read run without approval. A server that lies
(`readOnlyHint: true` to one process, `false` to another) would otherwise make one process
run at once what another shows as a write. So each process lists a server twice; the first
process to do so records what the server said (each tool's name, a digest of its input
schema and annotations) in Redis, and every process compares its listing with that record.

A server whose two listings disagree, or whose listing differs from the record, is marked
in Redis as having changed; while it is marked, every process that starts treats all of its
tools as writes (high risk: Approve asks to confirm), except those the servers file's
`effects:` pins, and says so in its log and in `switchboard tools`. Treating them as writes
is the safer choice that still works: nothing runs unseen, and no tool the policy names
disappears. `switchboard tools accept SERVER` clears the record and the mark and records
the server's current listing, when the operator has looked and agrees.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis
from mcp import types

from tools.yaml_nodes import printable

Fingerprint = dict[str, dict[str, Any]]
State = Literal["recorded", "same", "differs"]
MAX_NAMES = 20  # tool names kept in the mark, and shown
MAX_NAME = 80  # characters of each


@dataclass(frozen=True)
class Verdict:
    """What one process found for one server."""

    state: State
    differing: tuple[str, ...] = ()  # tools added, removed or changed (at most MAX_NAMES)
    reason: str = ""  # for people: what differed from what

    @property
    def differs(self) -> bool:
        return self.state == "differs"


SAME = Verdict("same")


def fingerprint(listing: Sequence[types.Tool]) -> Fingerprint:
    """Each tool's name, with a digest of its input schema and annotations and what its
    annotations say about reading."""
    result: Fingerprint = {}
    for tool in listing:
        annotations = (
            tool.annotations.model_dump(by_alias=True, exclude_none=True)
            if (tool.annotations is not None)
            else None
        )
        result[tool.name] = {
            "digest": _digest({"inputSchema": tool.input_schema, "annotations": annotations}),
            "readOnlyHint": annotations.get("readOnlyHint") if annotations else None,
        }
    return result


def differing(a: Fingerprint, b: Fingerprint) -> list[str]:
    """The names of tools one has and the other has not, or that differ, sorted; each cut
    to MAX_NAME characters and made printable (they go to logs and to the terminal)."""
    names = sorted(name for name in a.keys() | b.keys() if a.get(name) != b.get(name))
    return [printable(name[:MAX_NAME]) for name in names]


def compare(server: str, first: Sequence[types.Tool], second: Sequence[types.Tool]) -> Verdict:
    """A process's own check, without Redis: did the server say the same thing twice?"""
    changed = differing(fingerprint(first), fingerprint(second))
    if not changed:
        return SAME
    return Verdict("differs", tuple(changed[:MAX_NAMES]), "it listed its tools differently twice")


class Pins:
    """The recorded listings, in Redis: `listing_key(server)` holds the first listing,
    `mark_key(server)` is set once a listing differed."""

    def __init__(
        self,
        connection: redis.Redis,
        listing_key: Callable[[str], str],
        mark_key: Callable[[str], str],
    ) -> None:
        self.redis = connection
        self.listing_key = listing_key
        self.mark_key = mark_key

    def check(
        self, server: str, first: Sequence[types.Tool], second: Sequence[types.Tool]
    ) -> Verdict:
        """Record the server's listing if none is recorded yet, and say whether this
        process's two listings agree with each other, with the record and with the mark."""
        own = compare(server, first, second)
        listed = fingerprint(first)
        document = json.dumps({"tools": listed, "at": time.time()}, sort_keys=True)
        recorded = self.redis.set(self.listing_key(server), document, nx=True)
        if own.differs:
            return self._mark(server, own)
        if not recorded:
            raw = self.redis.get(self.listing_key(server))
            pinned = _tools_of(raw)
            changed = differing(pinned, listed) if pinned is not None else ["(unreadable record)"]
            if changed:
                return self._mark(
                    server,
                    Verdict(
                        "differs",
                        tuple(changed[:MAX_NAMES]),
                        "its listing differs from the recorded one",
                    ),
                )
        mark = self.marked(server)
        if mark is not None:
            return mark
        return Verdict("recorded") if recorded else SAME

    def marked(self, server: str) -> Verdict | None:
        """The mark a process left when a listing of this server differed, if any."""
        raw = self.redis.get(self.mark_key(server))
        if raw is None:
            return None
        try:
            mark = json.loads(raw)
            names = tuple(str(n) for n in mark["tools"][:MAX_NAMES])
            reason = str(mark["reason"])
        except (ValueError, KeyError, TypeError):
            names, reason = (), "a listing differed"
        return Verdict("differs", names, reason)

    def recorded(self, server: str) -> Fingerprint | None:
        return _tools_of(self.redis.get(self.listing_key(server)))

    def forget(self, server: str) -> bool:
        """Drop the record and the mark (the operator accepts the server as it is now);
        True if there was anything to drop."""
        return bool(self.redis.delete(self.listing_key(server), self.mark_key(server)))

    def _mark(self, server: str, verdict: Verdict) -> Verdict:
        mark = {"tools": list(verdict.differing), "reason": verdict.reason, "at": time.time()}
        self.redis.set(self.mark_key(server), json.dumps(mark))
        return verdict


def _tools_of(raw: bytes | str | None) -> Fingerprint | None:
    if raw is None:
        return None
    try:
        tools = json.loads(raw)["tools"]
    except (ValueError, KeyError, TypeError):
        return None
    return tools if isinstance(tools, dict) else None


def _digest(value: Any) -> str:
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        return "unreadable"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
