"""An approval request: one proposed write call waiting for a person to decide."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from tools.decode import canonical_json

INSTRUCTIONS_MAX = 1000  # what an approver tells the agent: an observation, kept small


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    WITHDRAWN = "withdrawn"  # the run was cancelled before anyone decided


def binding_hash(tool: str, args: dict[str, Any], requester: str, policy_version: str) -> str:
    """What an approval covers: this tool, exactly these arguments, this requester and policy."""
    material = canonical_json([tool, args, requester, policy_version])
    return hashlib.sha256(material.encode()).hexdigest()


@dataclass
class ApprovalRequest:
    id: str
    run_id: str
    call_id: str
    tool: str
    args: dict[str, Any]
    requester: str
    team_id: str
    channel_id: str
    policy_version: str
    binding: str
    created_at: float
    expires_at: float
    status: ApprovalStatus = ApprovalStatus.PENDING
    decided_by: str = ""
    decided_at: float = 0.0
    reason: str = ""
    # Approved with edits: what the model proposed (`args` then holds the edited arguments,
    # which the binding covers). None when approved as proposed, or not approved.
    original_args: dict[str, Any] | None = None
    # Rejected with instructions: what the approver told the agent to do instead.
    instructions: str = ""
    # Escalated: the policy's `escalate_to` roles may decide too (after `escalate_after`).
    escalated: bool = False
    # Where the surface showed the card (e.g. Slack channel and ts), so it can be updated later.
    cards: list[dict[str, str]] = field(default_factory=list)
    # Approved by a standing grant (approvals/grants.py) instead of a card: its id; the
    # grantor is `decided_by`. "" for a person's own decision.
    grant_id: str = ""

    @property
    def edited(self) -> bool:
        return self.original_args is not None

    @property
    def decided(self) -> bool:
        return self.status != ApprovalStatus.PENDING

    def covers(self, tool: str, args: dict[str, Any], requester: str) -> bool:
        return self.binding == binding_hash(tool, args, requester, self.policy_version)

    def to_hash(self) -> dict[str, str]:
        data = asdict(self)
        out: dict[str, str] = {}
        for key, value in data.items():
            if key in ("args", "cards"):
                out[key] = canonical_json(value)
            elif key == "original_args":
                out[key] = "" if value is None else canonical_json(value)
            elif key == "escalated":
                out[key] = "1" if value else ""
            else:
                out[key] = str(value)
        return out

    @classmethod
    def from_hash(cls, data: dict[str, str]) -> ApprovalRequest:
        return cls(
            id=data["id"],
            run_id=data["run_id"],
            call_id=data["call_id"],
            tool=data["tool"],
            args=json.loads(data["args"]),
            requester=data["requester"],
            team_id=data.get("team_id", ""),
            channel_id=data.get("channel_id", ""),
            policy_version=data["policy_version"],
            binding=data["binding"],
            created_at=float(data["created_at"]),
            expires_at=float(data["expires_at"]),
            status=ApprovalStatus(data["status"]),
            decided_by=data.get("decided_by", ""),
            decided_at=float(data.get("decided_at") or 0.0),
            reason=data.get("reason", ""),
            cards=json.loads(data.get("cards") or "[]"),
            original_args=json.loads(data["original_args"]) if data.get("original_args") else None,
            instructions=data.get("instructions", ""),
            escalated=data.get("escalated") == "1",
            grant_id=data.get("grant_id", ""),
        )
