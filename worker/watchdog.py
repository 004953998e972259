"""Job timeouts for worker slots: one watchdog thread per process instead of RQ's
`TimerDeathPenalty`, which starts a thread for every job (measurable CPU at hundreds of jobs
a second). SIGALRM, RQ's default, reaches only the main thread, and slots are threads or
greenlets (worker/pool.py), each interrupted in its own way.

The timeout is a backstop: a run's own deadline cuts each model call to what is left of it
(see `Settings.job_timeout`), so this fires only for a job stuck far past its budget.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from typing import Any

import structlog
from rq.timeouts import BaseDeathPenalty, JobTimeoutException

from worker import pool

log = structlog.get_logger(__name__)


class Watchdog:
    """Raises an exception in a slot (a thread or a greenlet) that overstays its deadline."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._due: list[tuple[float, int]] = []  # (deadline, ticket) heap
        self._threads: dict[int, Any] = {}  # ticket -> its slot (`pool.current()`), while armed
        self._tickets = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float) -> int:
        ticket = next(self._tickets)
        with self._lock:
            self._threads[ticket] = pool.current()
            heapq.heappush(self._due, (time.monotonic() + seconds, ticket))
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="watchdog", daemon=True)
                self._thread.start()
            self._lock.notify()
        return ticket

    def disarm(self, ticket: int) -> None:
        with self._lock:
            self._threads.pop(ticket, None)  # its heap entry is skipped when it comes due

    def _watch(self) -> None:
        with self._lock:
            while True:
                while self._due and self._due[0][1] not in self._threads:
                    heapq.heappop(self._due)
                if not self._due:
                    self._lock.wait()
                    continue
                wait = self._due[0][0] - time.monotonic()
                if wait > 0:
                    self._lock.wait(wait)
                    continue
                _deadline, ticket = heapq.heappop(self._due)
                slot = self._threads.pop(ticket)
                log.warning("job_timed_out", thread=pool.name_of(slot))
                pool.interrupt(slot, JobTimeoutException)


WATCHDOG = Watchdog()


class WatchdogDeathPenalty(BaseDeathPenalty):
    """RQ's death-penalty interface over the process's one watchdog."""

    def __init__(self, timeout: float, exception: Any = JobTimeoutException, **kwargs: Any):
        super().__init__(timeout, exception, **kwargs)
        self._ticket: int | None = None

    def setup_death_penalty(self) -> None:
        if self._timeout > 0:
            self._ticket = WATCHDOG.arm(self._timeout)

    def cancel_death_penalty(self) -> None:
        if self._ticket is not None:
            WATCHDOG.disarm(self._ticket)
            self._ticket = None
