"""Standing grants: an approver's "approve, and allow similar calls" (in this thread, or for
an hour or a day), and the atomic use of one to approve a later call without a card.

A grant is bound to one tool, one requester, for `thread` grants one thread, the policy
version and the tool's contract digest (`Tool.contract_digest`: schema, effect,
annotations) it was made under, and a constraint on the arguments: each argument of the
call the approver saw is either fixed (a later call must carry exactly that value) or
widened to any value by the approver; an argument that call did not have must stay
absent. Nothing else is covered.

`GrantStore.use` decides, in one Lua script, whether the grant still covers a call at this
moment (Redis's clock: not revoked, not expired, the same policy version and digest) and,
if so, writes the approval it gives: a grant racing its own expiry or revocation either
approved the call before it lapsed, or did not approve it at all.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from approvals.keys import ApprovalKeys
from approvals.request import ApprovalRequest
from tools.decode import canonical_json

SCOPE_SECONDS = {"thread": 24 * 3600.0, "hour": 3600.0, "day": 24 * 3600.0}
MAX_LIVE = 50  # live grants covering one requester at most
KEEP_AFTER = 7 * 24 * 3600  # a lapsed grant stays readable this long (runs show it)

# KEYS: grant hash, approval hash.  ARGV: policy version, tool digest, approval key ttl,
# grant id, then the approval's fields (name, value, ...).
_USE = """
if redis.call('EXISTS', KEYS[2]) == 1 then return {'exists', ''} end
local g = redis.call('HMGET', KEYS[1], 'expires_at', 'revoked_at', 'policy_version',
                     'tool_digest', 'grantor')
if not g[1] then return {'missing', ''} end
if (tonumber(g[2]) or 0) > 0 then return {'revoked', ''} end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
if now >= tonumber(g[1]) then return {'expired', ''} end
if g[3] ~= ARGV[1] then return {'policy_changed', ''} end
if g[4] ~= ARGV[2] then return {'tool_changed', ''} end
redis.call('HSET', KEYS[2], unpack(ARGV, 5))
redis.call('HSET', KEYS[2], 'status', 'approved', 'decided_by', g[5],
           'decided_at', tostring(now), 'grant_id', ARGV[4],
           'reason', 'allowed by a standing grant')
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3]))
redis.call('HINCRBY', KEYS[1], 'uses', 1)
return {'ok', tostring(now)}
"""

# KEYS: grant hash, the requester's index, the index of all.  ARGV: now, the cap, the hash's
# time to live, expires at, grant id, then the grant's fields (name, value, ...).
# Counts the requester's live grants and adds this one in one step: two approvers granting at
# once cannot both pass a count taken before either was added.
_CREATE = """
if redis.call('ZCOUNT', KEYS[2], ARGV[1], '+inf') >= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 6))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[5])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[5])
return 1
"""

# KEYS: grant hash, the requester's index, the index of all.  ARGV: revoker, grant id.
_REVOKE = """
local r = redis.call('HMGET', KEYS[1], 'id', 'revoked_at')
if not r[1] then return {'missing', ''} end
if (tonumber(r[2]) or 0) > 0 then return {'already', r[2]} end
local t = redis.call('TIME')
local now = tostring(tonumber(t[1]) + tonumber(t[2]) / 1000000)
redis.call('HSET', KEYS[1], 'revoked_by', ARGV[1], 'revoked_at', now)
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[2])
return {'ok', now}
"""


@dataclass(frozen=True)
class Constraint:
    """What a grant covers of a call's arguments: `fixed` ones must be equal (canonical
    JSON), `any` ones may be anything or absent; every other argument must be absent."""

    fixed: Mapping[str, Any] = field(default_factory=dict)
    any: tuple[str, ...] = ()

    @classmethod
    def of(cls, args: Mapping[str, Any], widened: set[str] | frozenset[str]) -> Constraint:
        """The approved call's arguments, each fixed unless the approver widened it."""
        return cls(
            fixed={k: v for k, v in args.items() if k not in widened}, any=tuple(sorted(widened))
        )

    def allows(self, args: Mapping[str, Any]) -> bool:
        if any(name not in self.fixed and name not in self.any for name in args):
            return False
        return all(
            name in args and canonical_json(args[name]) == canonical_json(value)
            for name, value in self.fixed.items()
        )

    def to_json(self) -> dict[str, Any]:
        return {"fixed": dict(self.fixed), "any": list(self.any)}


@dataclass
class Grant:
    id: str
    tool: str
    requester: str
    team_id: str
    grantor: str
    grantor_team: str
    scope: str  # "thread", "hour" or "day" (tools.policy_file.GRANT_SCOPES)
    thread: str  # for a thread grant, the thread it covers ("channel:thread_ts"); else ""
    constraint: Constraint
    policy_version: str
    tool_digest: str
    created_at: float
    expires_at: float
    approval_id: str  # the approval it was made with
    run_id: str
    revoked_by: str = ""
    revoked_at: float = 0.0
    uses: int = 0
    # the grantor was from another organization than the workspace's (Slack Connect) when
    # they made it: their roles are read again as such at every use
    grantor_external: bool = False

    @property
    def revoked(self) -> bool:
        return bool(self.revoked_at)

    def live(self, now: float | None = None) -> bool:
        return not self.revoked and (time.time() if now is None else now) < self.expires_at

    def matches(
        self, tool: str, requester: str, thread: str, args: Mapping[str, Any], team_id: str = ""
    ) -> bool:
        """Would it cover this call (liveness, policy and tool aside: `GrantStore.use`)? The
        same user id in another workspace is another person: the team must match too."""
        return (
            tool == self.tool
            and requester == self.requester
            and team_id == self.team_id
            and (self.scope != "thread" or (bool(thread) and thread == self.thread))
            and self.constraint.allows(args)
        )

    def to_hash(self) -> dict[str, str]:
        data = asdict(self)
        data["constraint"] = canonical_json(self.constraint.to_json())
        return {k: str(v) for k, v in data.items()}

    @classmethod
    def from_hash(cls, data: dict[str, str]) -> Grant:
        constraint = json.loads(data["constraint"])
        return cls(
            id=data["id"],
            tool=data["tool"],
            requester=data["requester"],
            team_id=data.get("team_id", ""),
            grantor=data["grantor"],
            grantor_team=data.get("grantor_team", ""),
            scope=data["scope"],
            thread=data.get("thread", ""),
            constraint=Constraint(constraint["fixed"], tuple(constraint["any"])),
            policy_version=data["policy_version"],
            tool_digest=data["tool_digest"],
            created_at=float(data["created_at"]),
            expires_at=float(data["expires_at"]),
            approval_id=data.get("approval_id", ""),
            run_id=data.get("run_id", ""),
            revoked_by=data.get("revoked_by", ""),
            revoked_at=float(data.get("revoked_at") or 0.0),
            uses=int(data.get("uses") or 0),
            grantor_external=data.get("grantor_external") == "True",
        )


@dataclass(frozen=True)
class Use:
    """The outcome of one attempt to approve a call with a grant: `why` is "ok", "exists"
    (this grant approved it before: a retried step), "asked" (the request exists, to be
    decided on a card), or why the grant did not cover it (missing, revoked, expired,
    policy_changed, tool_changed)."""

    why: str
    request: ApprovalRequest | None = None


class TooManyGrants(Exception):
    """The requester already has MAX_LIVE live grants."""


class GrantStore:
    def __init__(
        self, connection: redis.Redis, namespace: str = "sb:", keep_after: int = KEEP_AFTER
    ) -> None:
        self.redis = connection
        self.keys = ApprovalKeys(namespace)
        self.keep_after = keep_after
        self._use = connection.register_script(_USE)
        self._revoke = connection.register_script(_REVOKE)
        self._create = connection.register_script(_CREATE)

    def create(
        self,
        *,
        tool: str,
        requester: str,
        team_id: str,
        grantor: str,
        grantor_team: str,
        scope: str,
        thread: str,
        constraint: Constraint,
        policy_version: str,
        tool_digest: str,
        approval_id: str,
        run_id: str,
        grantor_external: bool = False,
    ) -> Grant:
        """A new grant for `SCOPE_SECONDS[scope]`; TooManyGrants past MAX_LIVE. Authorisation
        is the caller's (worker/service/grants.py)."""
        now = time.time()
        self._prune(requester, now)
        grant = Grant(
            id="gr_" + secrets.token_hex(10),
            tool=tool,
            requester=requester,
            team_id=team_id,
            grantor=grantor,
            grantor_team=grantor_team,
            scope=scope,
            thread=thread if scope == "thread" else "",
            constraint=constraint,
            policy_version=policy_version,
            tool_digest=tool_digest,
            created_at=now,
            expires_at=now + SCOPE_SECONDS[scope],
            approval_id=approval_id,
            run_id=run_id,
            grantor_external=grantor_external,
        )
        fields = [item for pair in grant.to_hash().items() for item in pair]
        added = self._create(
            keys=[self.keys.grant(grant.id), self.keys.grants_of(requester), self.keys.grants],
            args=[
                now,
                MAX_LIVE,
                int(SCOPE_SECONDS[scope]) + self.keep_after,
                grant.expires_at,
                grant.id,
                *fields,
            ],
        )
        if not added:
            raise TooManyGrants(requester)
        return grant

    def find(self, grant_id: str) -> Grant | None:
        data = self.redis.hgetall(self.keys.grant(grant_id))
        if not data:
            return None
        return Grant.from_hash({k.decode(): v.decode() for k, v in data.items()})

    def live_for(self, requester: str) -> list[Grant]:
        """The requester's grants not yet expired or revoked, the soonest to end first."""
        return self._read(self.keys.grants_of(requester))

    def live(self, limit: int = 500) -> list[Grant]:
        """Every grant not yet expired or revoked, the soonest to end first."""
        return self._read(self.keys.grants, limit)

    def _read(self, index: str, limit: int = MAX_LIVE) -> list[Grant]:
        now = time.time()
        ids = self.redis.zrangebyscore(index, now, "+inf", 0, limit)
        pipe = self.redis.pipeline(transaction=False)
        for grant_id in ids:
            pipe.hgetall(self.keys.grant(grant_id.decode()))
        found = []
        for data in pipe.execute():
            if data:
                grant = Grant.from_hash({k.decode(): v.decode() for k, v in data.items()})
                if grant.live(now):
                    found.append(grant)
        return found

    def _prune(self, requester: str, now: float) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.zremrangebyscore(self.keys.grants_of(requester), "-inf", now)
        pipe.zremrangebyscore(self.keys.grants, "-inf", now)
        pipe.execute()

    def use(
        self,
        grant: Grant,
        request: ApprovalRequest,
        *,
        policy_version: str,
        tool_digest: str,
        ttl: float,
    ) -> Use:
        """Approve `request` (not yet stored) with `grant`, if the grant covers it now."""
        fields = request.to_hash()
        flat = [item for pair in fields.items() for item in pair]
        why, _ = self._use(
            keys=[self.keys.grant(grant.id), self.keys.approval(request.id)],
            args=[policy_version, tool_digest, int(ttl) + KEEP_AFTER, grant.id, *flat],
        )
        outcome = why.decode()
        if outcome not in ("ok", "exists"):
            return Use(outcome)
        data = self.redis.hgetall(self.keys.approval(request.id))
        stored = ApprovalRequest.from_hash({k.decode(): v.decode() for k, v in data.items()})
        if stored.grant_id != grant.id:  # asked for on a card before: not this grant's
            return Use("asked", stored)
        return Use(outcome, stored)

    def revoke(self, grant: Grant, by: str) -> bool:
        """Revoke; False when it was revoked already (or is gone)."""
        outcome, _ = self._revoke(
            keys=[
                self.keys.grant(grant.id),
                self.keys.grants_of(grant.requester),
                self.keys.grants,
            ],
            args=[by, grant.id],
        )
        return bool(outcome.decode() == "ok")
