"""The Redis keys of approval requests and the execution ledger: the part of Switchboard's
key map (`worker.keys.Keys`) that this package, the lowest that keeps state, writes."""

from __future__ import annotations


class ApprovalKeys:
    def __init__(self, namespace: str = "sb:") -> None:
        self.ns = namespace

    def approval(self, approval_id: str) -> str:
        """Hash: one approval request."""
        return f"{self.ns}approval:{approval_id}"

    @property
    def pending(self) -> str:
        """Sorted set: pending approval ids by expiry time."""
        return f"{self.ns}approvals:pending"

    @property
    def owed_cards(self) -> str:
        """Sorted set: decided approval ids whose cards may still show buttons, by the time
        of the decision; the card update clears it, the sweeper redraws what it finds."""
        return f"{self.ns}approvals:owed"

    def batch(self, batch_id: str) -> str:
        """The approval ids of one card that shows several writes."""
        return f"{self.ns}batch:{batch_id}"

    def ledger(self, approval_id: str) -> str:
        """Hash: whether an approved write started and how it ended (exactly once)."""
        return f"{self.ns}ledger:{approval_id}"

    def grant(self, grant_id: str) -> str:
        """Hash: one standing grant (approvals/grants.py)."""
        return f"{self.ns}grant:{grant_id}"

    def grants_of(self, requester: str) -> str:
        """Sorted set: the live grants covering one requester's calls, by expiry time."""
        return f"{self.ns}grants:of:{requester}"

    @property
    def grants(self) -> str:
        """Sorted set: every live grant, by expiry time (for operators)."""
        return f"{self.ns}grants"
