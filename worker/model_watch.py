"""A model step while it runs (worker.model.Watch): each attempt recorded in the run's event
log when it starts and when it fails, not at the end of the step; the status saying how long
the model has been working; and what failed attempts cost charged to the run.

The events of a step are normally written with its save (worker/events.py); these are flushed
at once, with whatever the step recorded before them (the demonstrations it selected), so a
person following the run sees the model being asked while it is, and every retry as it
happens. A worker that stops mid-call leaves `model_call_started` without its outcome; the
next worker's step starts again with its own.
"""

from __future__ import annotations

import os
import time

from worker import metrics
from worker.events import EventKind
from worker.model import ModelError, Spent
from worker.run import Run
from worker.runtime import Runtime

WAITING = "Waiting for the model (step {step} of {steps}): {seconds:.0f} s of {deadline:.0f} s"
ATTEMPT = ", attempt {attempt} of {attempts}"


def charge(rt: Runtime, run: Run, prompt_tokens: int, completion_tokens: int) -> float:
    """Count tokens on the run, in the metrics and against the person's day; their cost."""
    usage = run.usage
    usage.prompt_tokens += prompt_tokens
    usage.completion_tokens += completion_tokens
    cost = rt.prices.cost(run.model, prompt_tokens, completion_tokens)
    usage.cost = round(usage.cost + cost, 8)
    metrics.tokens_spent(prompt_tokens, completion_tokens, cost)
    if rt.settings.limits.cost_per_day:
        rt.limits.spend(run.requester.user_id, cost)
    return cost


class StepWatch:
    """One model step of `run`: the `step`-th, with `timeout` seconds for all its attempts."""

    def __init__(
        self, rt: Runtime, run: Run, *, step: int, timeout: float, max_tokens: int
    ) -> None:
        self.rt, self.run = rt, run
        self.step, self.timeout, self.max_tokens = step, timeout, max_tokens
        self.attempt, self.attempts = 1, 1
        self.started = time.monotonic()

    def attempt_started(self, attempt: int, attempts: int) -> None:
        self.attempt, self.attempts = attempt, attempts
        self.rt.events.append(
            self.run.id,
            EventKind.MODEL_CALL_STARTED,
            step=self.step,
            attempt=attempt,
            attempts=attempts,
            deadline=round(self.timeout, 1),
            max_tokens=self.max_tokens,
            elapsed=round(time.monotonic() - self.started, 3),  # since the step began
            pid=os.getpid(),
        )
        self.rt.events.flush(self.run.id)
        if attempt > 1:  # a retry: the status says so at once
            self.waiting(time.monotonic() - self.started)

    def attempt_failed(
        self, attempt: int, attempts: int, error: ModelError, spent: Spent, seconds: float
    ) -> None:
        cost = charge(self.rt, self.run, spent.prompt_tokens, spent.completion_tokens)
        metrics.attempt_failed(spent.known)
        self.rt.events.append(
            self.run.id,
            EventKind.MODEL_ATTEMPT_FAILED,
            step=self.step,
            attempt=attempt,
            attempts=attempts,
            error_kind=error.kind,
            error=error.detail,
            seconds=round(seconds, 3),
            prompt_tokens=spent.prompt_tokens,
            completion_tokens=spent.completion_tokens,
            tokens=spent.known,
            cost=round(cost, 8),
        )
        self.rt.events.flush(self.run.id)

    def waiting(self, seconds: float) -> None:
        text = WAITING.format(
            step=self.step, steps=self.run.budgets.max_steps, seconds=seconds, deadline=self.timeout
        )
        if self.attempts > 1 and self.attempt > 1:
            text += ATTEMPT.format(attempt=self.attempt, attempts=self.attempts)
        self.rt.surface(self.run).progress(self.run, text)
