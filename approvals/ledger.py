"""The execution ledger: an approved write runs at most once, even across crashes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import redis

from approvals.keys import ApprovalKeys

# KEYS: ledger hash.  ARGV: binding, ttl.  Returns the state before this call ('' when new).
_BEGIN = """
local state = redis.call('HGET', KEYS[1], 'state')
if state then return state end
redis.call('HSET', KEYS[1], 'state', 'started', 'binding', ARGV[1])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return ''
"""


class LedgerState(StrEnum):
    NEW = "new"  # nobody started it: this caller now owns the one execution
    STARTED = "started"  # started earlier and never finished: a crash, outcome unknown
    FINISHED = "finished"  # done: replay the stored result


@dataclass(frozen=True)
class LedgerEntry:
    state: LedgerState
    ok: bool = False
    result: Any = None


class ExecutionLedger:
    def __init__(
        self, connection: redis.Redis, namespace: str = "sb:", ttl: int = 30 * 24 * 3600
    ) -> None:
        self.redis = connection
        self.ns = namespace
        self.keys = ApprovalKeys(namespace)
        self.ttl = ttl
        self._begin = connection.register_script(_BEGIN)

    def begin(self, approval_id: str, binding: str) -> LedgerEntry:
        """Claim the execution. Only a caller that gets `NEW` may run the tool."""
        before = self._begin(
            keys=[self.keys.ledger(approval_id)], args=[binding, self.ttl]
        ).decode()
        if before == "":
            return LedgerEntry(LedgerState.NEW)
        if before == LedgerState.FINISHED:
            return self.get(approval_id)
        return LedgerEntry(LedgerState.STARTED)

    def finish(self, approval_id: str, ok: bool, result: Any) -> None:
        self.redis.hset(
            self.keys.ledger(approval_id),
            mapping={
                "state": LedgerState.FINISHED.value,
                "ok": int(ok),
                "result": json.dumps(result),
            },
        )

    def get(self, approval_id: str) -> LedgerEntry:
        data = {
            k.decode(): v.decode()
            for k, v in self.redis.hgetall(self.keys.ledger(approval_id)).items()
        }
        if not data:
            return LedgerEntry(LedgerState.NEW)
        state = LedgerState(data["state"])
        if state != LedgerState.FINISHED:
            return LedgerEntry(state)
        return LedgerEntry(state, ok=data.get("ok") == "1", result=json.loads(data["result"]))
