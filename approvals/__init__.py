"""Approval requests, atomic decisions and the execution ledger."""

from approvals.ledger import ExecutionLedger, LedgerEntry, LedgerState
from approvals.request import ApprovalRequest, ApprovalStatus, binding_hash
from approvals.store import WAKE_LUA, ApprovalNotFound, ApprovalStore, Decision

__all__ = [
    "WAKE_LUA",
    "ApprovalNotFound",
    "ApprovalRequest",
    "ApprovalStatus",
    "ApprovalStore",
    "Decision",
    "ExecutionLedger",
    "LedgerEntry",
    "LedgerState",
    "binding_hash",
]
