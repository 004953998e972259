"""Audit queries over stored runs: "what did the bot do yesterday in #finance?".

Store-level functions (a use case or a surface calls them): `find_runs` filters runs by
user, channel, status and creation time through the indexes of worker/store.py, bounded in
what it reads; `export_runs` streams each run with its whole event log (deciders included)
one at a time, oldest first, so an export of any size holds one chunk in memory; `parse_when`
reads the times people type (ISO 8601, or `24h` ago); `log_decision` writes the log line
of every approval decision.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog

from approvals import ApprovalRequest
from worker.eventlog import EventLog
from worker.run import Run, RunStatus
from worker.store import RunStore

log = structlog.get_logger(__name__)

CHUNK = 200  # index entries (documents) read per round trip
MAX_SCAN = 20_000  # documents one listing reads at most: a bound on its time and memory
MAX_LIMIT = 500  # runs one listing returns at most
MAX_WHEN_CHARS = 64
MAX_AGO_SECONDS = 20 * 366 * 86400.0
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGO = re.compile(r"^(\d{1,9}(?:\.\d{1,6})?)([smhdw])$")


class WhenError(ValueError):
    """A time that is neither ISO 8601 nor relative; its message says what is accepted."""


def parse_when(text: str, now: float | None = None) -> float:
    """A moment as a Unix time: ISO 8601 (`2026-12-01`, `2026-12-01T09:30`, with `Z` or an
    offset; without one, UTC) or an age (`90s`, `30m`, `24h`, `7d`, `2w`: that long ago)."""
    now = time.time() if now is None else now
    value = text.strip()
    if not value or len(value) > MAX_WHEN_CHARS:
        raise WhenError(_when_help(text))
    ago = _AGO.match(value.lower())
    if ago is not None:
        seconds = float(ago.group(1)) * _UNITS[ago.group(2)]
        if seconds > MAX_AGO_SECONDS:
            raise WhenError(f"{text!r} is more than 20 years ago; give a date instead")
        return now - seconds
    try:
        moment = datetime.fromisoformat(value.replace("z", "Z"))
    except ValueError:
        raise WhenError(_when_help(text)) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    stamp = moment.timestamp()
    if not math.isfinite(stamp):
        raise WhenError(_when_help(text))
    return stamp


def _when_help(text: str) -> str:
    shown = text if len(text) <= MAX_WHEN_CHARS else text[:MAX_WHEN_CHARS] + "…"
    return (
        f"{shown!r} is not a time: use ISO 8601 (2026-12-01, 2026-12-01T09:30Z) or how long "
        "ago (90s, 30m, 24h, 7d, 2w)"
    )


@dataclass(frozen=True)
class RunFilter:
    """Every field optional; `since`/`until` bound the creation time (inclusive)."""

    user_id: str | None = None
    channel_id: str | None = None
    status: RunStatus | None = None
    since: float | None = None
    until: float | None = None

    def matches(self, document: dict[str, Any]) -> bool:
        """On the stored document, so the runs a listing passes over are never validated."""
        asker = document.get("requester")
        asker = asker if isinstance(asker, dict) else {}
        created = document.get("created_at")
        if not isinstance(created, int | float):
            return self.since is None and self.until is None
        return (
            (self.user_id is None or asker.get("user_id") == self.user_id)
            and (self.channel_id is None or asker.get("channel_id") == self.channel_id)
            and (self.status is None or document.get("status") == self.status.value)
            and (self.since is None or created >= self.since)
            and (self.until is None or created <= self.until)
        )


@dataclass
class Found:
    runs: list[Run] = field(default_factory=list)  # newest first
    scanned: int = 0  # documents read
    truncated: bool = False  # stopped after MAX_SCAN documents: older matches may exist


def find_runs(
    store: RunStore, where: RunFilter, limit: int = 20, *, max_scan: int = MAX_SCAN
) -> Found:
    """The newest `limit` runs that match, through the narrowest index: the user's runs
    (scored by creation time); else, for a status without a time range, the status index
    (scored by when each run reached the status: the runs that reached it last, as App Home
    lists them); else all
    runs in the time range. A channel has no index of its own: its runs are found among
    those the time range names."""
    limit = max(1, min(limit, MAX_LIMIT))
    high = "+inf" if where.until is None else where.until
    low = "-inf" if where.since is None else where.since
    if where.user_id is not None:
        index = store.keys.user_runs(where.user_id)
    elif where.status is not None and where.since is None and where.until is None:
        index = store.keys.status(where.status)
    else:
        index = store.keys.all_runs
    found = Found()
    offset = 0
    while len(found.runs) < limit:
        if found.scanned >= max_scan:
            found.truncated = True
            break
        count = min(CHUNK, max_scan - found.scanned)
        ids = store.redis.zrevrangebyscore(index, high, low, start=offset, num=count)
        if not ids:
            break
        offset += len(ids)
        found.scanned += len(ids)
        raws = store.redis.mget([store.keys.run(i.decode()) for i in ids])
        seen = {r.id for r in found.runs}  # a run created meanwhile shifts the pages by one
        documents = store.documents(zip(ids, raws, strict=True))
        found.runs += [
            Run.from_document(d) for d in documents if where.matches(d) and d["id"] not in seen
        ]
    found.runs.sort(key=lambda r: r.created_at, reverse=True)  # a status index is by arrival
    del found.runs[limit:]
    return found


def run_summary(run: Run) -> dict[str, Any]:
    """One run in a listing (`runs list --json`): who, where, when, how it ended, cost."""
    return {
        "id": run.id,
        "status": run.status.value,
        "reason": run.reason.value if run.reason else None,
        "user": run.requester.user_id,
        "team": run.requester.team_id,
        "channel": run.requester.channel_id,
        "question": run.question,
        "created_at": iso(run.created_at),
        "ended_at": iso(run.ended_at) if run.ended_at else None,
        "profile": run.profile.name if run.profile else None,
        "policy_version": run.policy_version or None,
        "model": run.model,
        "steps": run.usage.steps,
        "tool_calls": run.usage.tool_calls,
        "tokens": run.usage.tokens,
        "cost": round(run.usage.cost, 6),
    }


def iso(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def export_runs(
    store: RunStore, events: EventLog, since: float, until: float | None = None
) -> Iterator[dict[str, Any]]:
    """Each run created in [since, until], oldest first, with its whole event log (who did
    what: approvals and their deciders, tool calls, results), as `runs show --json` gives
    one. Streamed: one chunk of documents at a time. Runs of an unknown schema version are
    skipped (counted by the store)."""
    high: float | str = "+inf" if until is None else until
    low = since
    # Paged by score, not by offset: retention trims the oldest entries while an export
    # runs, which would shift offsets and skip runs. Runs created in the same instant
    # share a score: those already exported at `low` are skipped on the next page.
    done_at_low: set[bytes] = set()
    while True:
        asked = CHUNK + len(done_at_low)
        page = store.redis.zrangebyscore(
            store.keys.all_runs, low, high, start=0, num=asked, withscores=True
        )
        fresh = [(i, score) for i, score in page if not (score == low and i in done_at_low)]
        if not fresh:
            return
        ids = [i for i, _ in fresh]
        raws = store.redis.mget([store.keys.run(i.decode()) for i in ids])
        documents = store.documents(zip(ids, raws, strict=True))
        logs = events.read_all([str(d.get("id", "")) for d in documents])
        for document, log in zip(documents, logs, strict=True):
            yield {
                "run": document,
                "events": [{"id": e.id, "at": e.at, "kind": e.kind, **e.data} for e in log],
            }
        if len(page) < asked:
            return
        last = fresh[-1][1]
        if last != low:
            low, done_at_low = last, set()
        done_at_low |= {i for i, score in fresh if score == last}


def log_decision(request: ApprovalRequest, surface: str) -> None:
    """Every decision as one structured line (`approval_decided`): who decided what, for
    whom, when and where. No argument values and no reason text: they may hold anything."""
    log.info(
        "approval_decided",
        approval_id=request.id,
        run_id=request.run_id,
        tool=request.tool,
        requester=request.requester,
        decided_by=request.decided_by or None,
        outcome=request.status.value,
        surface=surface,
        decided_at=request.decided_at,
        edited=request.original_args is not None,
        policy_version=request.policy_version,
    )
