"""Approval requests in Redis: creation, atomic decisions, expiry, withdrawal."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

import redis

from approvals.keys import ApprovalKeys
from approvals.request import INSTRUCTIONS_MAX, ApprovalRequest, ApprovalStatus, binding_hash
from tools.decode import canonical_json

# Wake a run: (re)score it in the due set with a strictly increasing millisecond stamp, so a
# worker that read an older score knows it must look again before it lets the run rest.
WAKE_LUA = """
local function wake(due, member)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local cur = redis.call('ZSCORE', due, member)
  if cur and tonumber(cur) >= now then now = tonumber(cur) + 1 end
  redis.call('ZADD', due, now, member)
end
"""

# KEYS: approval hash, pending index, due set, owed cards.  ARGV: status, decider, reason,
# id, edited args, their binding, the original args (all three '' unless approved with
# edits), instructions ('' unless rejected with them).
# Of concurrent decisions exactly one finds the request pending; the rest get the winner back.
# An edit replaces the arguments and the binding in the same step as the decision: the
# approval covers exactly the edited call, and nothing can run the original under it. The
# decision's cards are owed an update from the same step: whoever won may die before it
# redraws them, and the sweeper then does (`owed_cards`). Returns {'missing'}, or the outcome
# ('ok': this call decided; 'decided': another did first) and the request's fields as they
# stand after it: no round trip before or after the decision to read them (issue 28: every
# round trip between an Approve click and the tool starting counts).
_DECIDE = (
    WAKE_LUA
    + """
local fields = redis.call('HMGET', KEYS[1], 'status', 'expires_at', 'run_id')
if not fields[1] then return {'missing'} end
if fields[1] ~= 'pending' then return {'decided', redis.call('HGETALL', KEYS[1])} end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local status, decider, reason = ARGV[1], ARGV[2], ARGV[3]
if (status == 'approved' or status == 'rejected') and now >= tonumber(fields[2]) then
  status, decider, reason = 'expired', '', 'nobody decided before it expired'
end
redis.call('HSET', KEYS[1], 'status', status, 'decided_by', decider,
           'decided_at', tostring(now), 'reason', reason)
if status == 'approved' and ARGV[5] ~= '' then
  redis.call('HSET', KEYS[1], 'args', ARGV[5], 'binding', ARGV[6], 'original_args', ARGV[7])
end
if status == 'rejected' and ARGV[8] ~= '' then
  redis.call('HSET', KEYS[1], 'instructions', ARGV[8])
end
redis.call('ZREM', KEYS[2], ARGV[4])
redis.call('ZADD', KEYS[4], now, ARGV[4])
wake(KEYS[3], fields[3])
return {'ok', redis.call('HGETALL', KEYS[1])}
"""
)


def new_request(
    *,
    approval_id: str | None,
    run_id: str,
    call_id: str,
    tool: str,
    args: dict[str, Any],
    requester: str,
    team_id: str,
    channel_id: str,
    policy_version: str,
    ttl: float,
) -> ApprovalRequest:
    """A pending request, bound to exactly these arguments, not yet stored."""
    now = time.time()
    return ApprovalRequest(
        id=approval_id or "ap_" + secrets.token_hex(10),
        run_id=run_id,
        call_id=call_id,
        tool=tool,
        args=args,
        requester=requester,
        team_id=team_id,
        channel_id=channel_id,
        policy_version=policy_version,
        binding=binding_hash(tool, args, requester, policy_version),
        created_at=now,
        expires_at=now + ttl,
    )


class ApprovalNotFound(LookupError):
    pass


@dataclass(frozen=True)
class Decision:
    """The outcome of one attempt to decide: `won` is true for exactly one attempt per request."""

    won: bool
    request: ApprovalRequest


PAGE = 500  # requests read per round trip

# KEYS: approval hash, pending index.  ARGV: seconds to keep, expiry, id, then the hash's
# fields and values. A request is written only where none is: two workers driving one run
# at once (its lease lapsed under a stalled Redis) both found none, and the second write
# put back an empty list of cards over the card the first had posted and recorded, so the
# decision was never drawn on it (found by the chaos soak, seed 62). Returns 1 if written.
_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]))
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
return 1
"""

# KEYS: approval hash, owed cards.  ARGV: the card (canonical JSON), id.
# Appends the card in one step, so two cards recorded at once both stay (a read, then a write
# of the whole list, lost one). A card recorded once the request is decided was not redrawn
# by the decider, which knew only the cards before it: it is owed the outcome (found by the
# chaos soak: a run driven again after a lost lease posted its card after the expiry).
# Returns the request's status, or nil when there is no request.
_ADD_CARD = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return false end
local cards = redis.call('HGET', KEYS[1], 'cards')
if not cards or cards == '' or cards == '[]' then
  cards = '[' .. ARGV[1] .. ']'
elseif not string.find(cards, ARGV[1], 1, true) then  -- recorded again after a lost answer
  cards = string.sub(cards, 1, -2) .. ',' .. ARGV[1] .. ']'
end
redis.call('HSET', KEYS[1], 'cards', cards)
if status ~= 'pending' then
  local t = redis.call('TIME')  -- owed since the decision, when it is owed already
  redis.call('ZADD', KEYS[2], 'NX', tonumber(t[1]) + tonumber(t[2]) / 1000000, ARGV[2])
end
return status
"""

# KEYS: approval hash, owed cards.  ARGV: id, how many of its cards were redrawn ('' for all).
# The debt is cleared only if no card was recorded since the redrawer read the cards: a card
# posted meanwhile (`_ADD_CARD`) stays owed for its poster or the sweeper.
_CARD_SHOWN = """
if ARGV[2] ~= '' then
  local cards = redis.call('HGET', KEYS[1], 'cards')
  if cards and cards ~= '' and #cjson.decode(cards) > tonumber(ARGV[2]) then return 0 end
end
return redis.call('ZREM', KEYS[2], ARGV[1])
"""


class ApprovalStore:
    """Keys: `{ns}approval:{id}` (hash), `{ns}approvals:pending` (zset id -> expires_at)."""

    def __init__(
        self,
        connection: redis.Redis,
        *,
        due_key: str,
        namespace: str = "sb:",
        keep_after_decision: int = 7 * 24 * 3600,
    ) -> None:
        self.redis = connection
        self.ns = namespace
        self.keys = ApprovalKeys(namespace)
        self.due_key = due_key
        self.keep_after_decision = keep_after_decision
        self._create = connection.register_script(_CREATE)
        self._decide = connection.register_script(_DECIDE)
        self._add_card = connection.register_script(_ADD_CARD)
        self._card_shown = connection.register_script(_CARD_SHOWN)

    def create(
        self,
        *,
        approval_id: str | None = None,
        run_id: str,
        call_id: str,
        tool: str,
        args: dict[str, Any],
        requester: str,
        team_id: str,
        channel_id: str,
        policy_version: str,
        ttl: float,
    ) -> ApprovalRequest:
        """A new pending request. With an `approval_id` that exists, that request instead (one
        script writes it only where none is: a worker asking again after a restart, or two
        driving one run at once, find the first request, not a second)."""
        request = new_request(
            approval_id=approval_id,
            run_id=run_id,
            call_id=call_id,
            tool=tool,
            args=args,
            requester=requester,
            team_id=team_id,
            channel_id=channel_id,
            policy_version=policy_version,
            ttl=ttl,
        )
        if not self._write_new(request, ttl):
            return self.get(request.id)
        return request

    def _write_new(self, request: ApprovalRequest, ttl: float) -> bool:
        """Store `request` unless one with its id exists; whether it was stored."""
        fields = [part for pair in request.to_hash().items() for part in pair]
        return bool(
            self._create(
                keys=[self.keys.approval(request.id), self.keys.pending],
                args=[int(ttl + self.keep_after_decision), request.expires_at, request.id, *fields],
            )
        )

    def get(self, approval_id: str) -> ApprovalRequest:
        data = self.redis.hgetall(self.keys.approval(approval_id))
        if not data:
            raise ApprovalNotFound(approval_id)
        return ApprovalRequest.from_hash({k.decode(): v.decode() for k, v in data.items()})

    def find(self, approval_id: str) -> ApprovalRequest | None:
        try:
            return self.get(approval_id)
        except ApprovalNotFound:
            return None

    def decide(
        self,
        approval_id: str,
        status: ApprovalStatus,
        decided_by: str,
        reason: str = "",
        *,
        edited_args: dict[str, Any] | None = None,
        instructions: str = "",
    ) -> Decision:
        """Move a pending request to `status`. Authorization (and, for `edited_args`,
        validation) is the caller's job. Approving with `edited_args` rebinds the request to
        them; `instructions` go with a rejection."""
        edit = ["", "", ""]
        if edited_args is not None and status == ApprovalStatus.APPROVED:
            request = self.get(approval_id)  # the arguments the edit replaces, and the binding
            binding = binding_hash(
                request.tool, edited_args, request.requester, request.policy_version
            )
            edit = [canonical_json(edited_args), binding, canonical_json(request.args)]
        result = self._decide(
            keys=[
                self.keys.approval(approval_id),
                self.keys.pending,
                self.due_key,
                self.keys.owed_cards,
            ],
            args=[
                status.value,
                decided_by,
                reason[:1000],
                approval_id,
                *edit,
                instructions[:INSTRUCTIONS_MAX],
            ],
        )
        outcome = result[0].decode()
        if outcome == "missing":
            raise ApprovalNotFound(approval_id)
        flat = [item.decode() for item in result[1]]
        fields = dict(zip(flat[::2], flat[1::2], strict=True))
        return Decision(won=outcome == "ok", request=ApprovalRequest.from_hash(fields))

    def expire(self, approval_id: str) -> Decision:
        return self.decide(approval_id, ApprovalStatus.EXPIRED, "", "nobody decided in time")

    def withdraw(self, approval_id: str, reason: str) -> Decision:
        return self.decide(approval_id, ApprovalStatus.WITHDRAWN, "", reason)

    def escalate(self, approval_id: str) -> bool:
        """Mark a pending request escalated; False when it was decided (or gone) already."""
        script = (
            "if redis.call('HGET', KEYS[1], 'status') ~= 'pending' then return 0 end "
            "redis.call('HSET', KEYS[1], 'escalated', '1') return 1"
        )
        return bool(self.redis.eval(script, 1, self.keys.approval(approval_id)))

    def create_batch(self, requests: list[ApprovalRequest]) -> str:
        """One record for the requests a turn asked for together (one card, Approve all);
        each request stays its own, bound to its own arguments and decided on its own."""
        ids = [r.id for r in requests]
        batch_id = "bt_" + hashlib.sha256(",".join(ids).encode()).hexdigest()[:20]
        ttl = max(r.expires_at for r in requests) - time.time() + self.keep_after_decision
        self.redis.set(self.keys.batch(batch_id), json.dumps(ids), ex=max(1, int(ttl)))
        return batch_id

    def batch(self, batch_id: str) -> list[ApprovalRequest]:
        raw = self.redis.get(self.keys.batch(batch_id))
        ids = json.loads(raw) if raw else []
        found = (self.find(i) for i in ids if isinstance(i, str))
        return [r for r in found if r is not None]

    def add_card(self, approval_id: str, card: dict[str, str]) -> bool:
        """Record where a card of the request was shown. False when the request was decided
        before the card was recorded: whoever decided redrew the cards it knew of, not this
        one, so the card is owed the outcome (the sweeper redraws it if the caller does not)."""
        found = self._add_card(
            keys=[self.keys.approval(approval_id), self.keys.owed_cards],
            args=[canonical_json(card), approval_id],
        )
        if found is None:
            raise ApprovalNotFound(approval_id)
        return bool(found == b"pending")

    def card_shown(self, approval_id: str, drawn: int | None = None) -> None:
        """Its cards show the decision now (or it has none left to redraw). With `drawn`,
        the number of its cards the caller redrew: a card recorded since stays owed."""
        self._card_shown(
            keys=[self.keys.approval(approval_id), self.keys.owed_cards],
            args=[approval_id, "" if drawn is None else drawn],
        )

    def owed_cards(self, older_than: float, limit: int = 100) -> list[str]:
        """Decided requests whose cards were not redrawn within `older_than` seconds."""
        cutoff = time.time() - older_than
        found = self.redis.zrangebyscore(self.keys.owed_cards, 0, cutoff, 0, limit)
        return [i.decode() for i in found]

    def pending(self, limit: int = 200) -> list[ApprovalRequest]:
        """Pending requests, the soonest to expire first; read in one round trip per
        `PAGE` of them."""
        ids = [i.decode() for i in self.redis.zrange(self.keys.pending, 0, limit - 1)]
        found: list[ApprovalRequest] = []
        for start in range(0, len(ids), PAGE):
            pipe = self.redis.pipeline(transaction=False)
            for approval_id in ids[start : start + PAGE]:
                pipe.hgetall(self.keys.approval(approval_id))
            for data in pipe.execute():
                if data:
                    request = ApprovalRequest.from_hash(
                        {k.decode(): v.decode() for k, v in data.items()}
                    )
                    if request.status == ApprovalStatus.PENDING:
                        found.append(request)
        return found

    def overdue(self, now: float | None = None, limit: int = 100) -> list[str]:
        """Pending requests past their expiry (a backstop for the scheduled expiry job)."""
        cutoff = time.time() if now is None else now
        return [
            i.decode() for i in self.redis.zrangebyscore(self.keys.pending, 0, cutoff, 0, limit)
        ]
