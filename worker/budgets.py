"""Budgets and prices: what a run may spend, and what it has spent."""

from __future__ import annotations

from worker.run import Budgets, EndReason, Usage

# USD per million tokens (input, output). Override with SWITCHBOARD_PRICES.
DEFAULT_PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "o4-mini": (1.10, 4.40),
}


class PriceTable:
    def __init__(self, prices: dict[str, tuple[float, float]] | None = None) -> None:
        self.prices = dict(DEFAULT_PRICES if prices is None else prices)

    def cost(self, model: str, prompt_tokens: int, completion_tokens: int) -> float:
        per_in, per_out = self._lookup(model)
        return (prompt_tokens * per_in + completion_tokens * per_out) / 1_000_000

    def known(self, model: str) -> bool:
        return self._find(model) is not None

    def _lookup(self, model: str) -> tuple[float, float]:
        found = self._find(model)
        return found if found is not None else (0.0, 0.0)

    def _find(self, model: str) -> tuple[float, float] | None:
        if model in self.prices:
            return self.prices[model]
        # dated snapshots ("gpt-4o-mini-2024-07-18") price like their family; longest prefix wins
        family = [name for name in self.prices if model.startswith(name + "-")]
        return self.prices[max(family, key=len)] if family else None


def exhausted(
    budgets: Budgets, usage: Usage, active_seconds: float
) -> tuple[EndReason, str] | None:
    """The first budget a run has used up before its next model call, in words."""
    if usage.steps >= budgets.max_steps:
        return EndReason.MAX_STEPS, f"stopped after {usage.steps} steps (the limit)"
    if active_seconds >= budgets.deadline_seconds:
        return EndReason.DEADLINE, f"ran out of time ({budgets.deadline_seconds:.0f} s of work)"
    if usage.tokens >= budgets.max_tokens:
        return EndReason.TOKENS, f"used {usage.tokens} tokens (limit {budgets.max_tokens})"
    if usage.cost >= budgets.max_cost:
        return EndReason.COST, f"spent ${usage.cost:.4f} (limit ${budgets.max_cost:.2f})"
    return None
