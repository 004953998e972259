"""A model step while it runs (worker.model.Watch): each attempt recorded in the run's event
log when it starts and when it fails, not at the end of the step; the status saying how long
the model has been working; and what the step's attempts cost, charged to the run and to the
person's day (a failed attempt's as it fails, the answer's as the step ends).

The events of a step are normally written with its save (worker/events.py); these are written
at once, with whatever the step recorded before them (the demonstrations it selected), so a
person following the run sees the model being asked while it is, and every retry as it
happens. The first attempt's start is written by the script that reserves the call against
the person's day (worker/limits.py), and the answer's cost, with the end of its place in
flight, by the step's save when the worker holds the run's charges (a job, worker/jobs.py),
else by a script of its own: a model call costs Redis one round trip besides its step's save
(two before, four when priced; issue 28). While the person's largest call today costs nothing
(an unpriced model, or no priced call yet), no place in flight is held: the start writes no
place and an answer that costs nothing ends none. A worker that stops mid-call leaves
`model_call_started` without its outcome; the next worker's step starts again with its own.
"""

from __future__ import annotations

import os
import time

from worker import metrics
from worker.events import EventKind
from worker.model_base import ModelError, Spent
from worker.run import Run
from worker.runtime import Runtime

WAITING = "Waiting for the model (step {step} of {steps}): {seconds:.0f} s of {deadline:.0f} s"
ATTEMPT = ", attempt {attempt} of {attempts}"


class StepWatch:
    """One model step of `run`: the `step`-th, with `timeout` seconds for all its attempts,
    made by a model that tries up to `attempts` times. `begin` before the first attempt,
    `end` after the last, whatever happened between."""

    def __init__(
        self, rt: Runtime, run: Run, *, step: int, timeout: float, max_tokens: int, attempts: int
    ) -> None:
        self.rt, self.run = rt, run
        self.step, self.timeout, self.max_tokens = step, timeout, max_tokens
        self.attempt, self.attempts = 1, attempts
        self.started = time.monotonic()
        self.unspent = 0.0  # charged to the run, not yet to the person's day
        self.reserved = False  # started under the person's daily cap: charged by `end`
        self.held = False  # a place in flight against the person's day, until `end`

    def begin(self, shown: tuple[str, list[str]] = ("", [])) -> str | None:
        """Reserve the call against the person's day (worker/limits.py) and record its first
        attempt as started, with the events the step held (the demonstrations it selected,
        `shown` counted in the task library's usage: their key and ids), in one write. The
        day's spend in words when the call may not start; the held events stay held then (or
        when the write fails), for the run's next save, and nothing is counted."""
        rt, run = self.rt, self.run
        held = rt.events.take(run.id)
        started = rt.events.encode(EventKind.MODEL_CALL_STARTED, **self._started(1))
        written = False
        try:
            log_key = rt.events.keys.events(run.id)
            call = rt.limits.begin_call(
                run.requester.user_id,
                run.id,
                log_key,
                [*held, started],
                rt.events.retention,
                shown,
            )
            written, self.reserved, self.held = call.over is None, call.reserved, call.held
        finally:
            if not written:
                rt.events.put_back(run.id, held)
        return call.over

    def end(self) -> None:
        """The step's call is over: what its answer cost goes to the person's day as the
        call stops counting as in flight, in one write (the step's save, in a job)."""
        user_id = self.run.requester.user_id
        self.rt.limits.end_call(
            user_id, self.run.id, self.unspent, reserved=self.reserved, held=self.held
        )
        self.unspent, self.reserved, self.held = 0.0, False, False

    def charge(self, prompt_tokens: int, completion_tokens: int) -> float:
        """Count tokens on the run and in the metrics; their cost. It counts against the
        person's day with `end` (a failed attempt's, at once: `attempt_failed`)."""
        usage = self.run.usage
        usage.prompt_tokens += prompt_tokens
        usage.completion_tokens += completion_tokens
        cost = self.rt.prices.cost(self.run.model, prompt_tokens, completion_tokens)
        usage.cost = round(usage.cost + cost, 8)
        metrics.tokens_spent(prompt_tokens, completion_tokens, cost)
        self.unspent += cost
        return cost

    def _started(self, attempt: int) -> dict[str, object]:
        return {
            "step": self.step,
            "attempt": attempt,
            "attempts": self.attempts,
            "deadline": round(self.timeout, 1),
            "max_tokens": self.max_tokens,
            "elapsed": round(time.monotonic() - self.started, 3),  # since the step began
            "pid": os.getpid(),
        }

    def attempt_started(self, attempt: int, attempts: int) -> None:
        """A retry is recorded as it starts; the first attempt was, by `begin`."""
        self.attempt, self.attempts = attempt, attempts
        if attempt == 1:
            return
        self.rt.events.append(self.run.id, EventKind.MODEL_CALL_STARTED, **self._started(attempt))
        self.rt.events.flush_live(self.run.id)
        self.waiting(time.monotonic() - self.started)  # a retry: the status says so at once

    def attempt_failed(
        self, attempt: int, attempts: int, error: ModelError, spent: Spent, seconds: float
    ) -> None:
        cost = self.charge(spent.prompt_tokens, spent.completion_tokens)
        # against the person's day now: another run's call checks the cap while this retries
        self.rt.limits.spend(self.run.requester.user_id, self.unspent, reserved=self.reserved)
        self.unspent = 0.0
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
        self.rt.events.flush_live(self.run.id)

    def waiting(self, seconds: float) -> None:
        text = WAITING.format(
            step=self.step, steps=self.run.budgets.max_steps, seconds=seconds, deadline=self.timeout
        )
        if self.attempts > 1 and self.attempt > 1:
            text += ATTEMPT.format(attempt=self.attempt, attempts=self.attempts)
        self.rt.surface(self.run).progress(self.run, text)
