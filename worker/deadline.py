"""One blocking call held to a deadline, whatever the server on the other end does.

The openai SDK's timeout is per read, and it retries a timed-out request with the whole
timeout again: a model that stalls mid-stream just before the deadline is waited for one more
timeout (measured: 6.0 s for a 3 s deadline), one that never answers once per retry (10.4 s
for 3 s with the default 2 retries). So the call runs in a thread of its own and the run
stops waiting at its deadline; the thread is left to end at its own timeout, and the answer
text it might still stream is cut off from the surface (`CutOffSink`), so nothing it writes
late reaches people.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from tools.threads import InThread
from worker.streaming import TextSink

T = TypeVar("T")


class Overdue(Exception):
    """The call did not return within its deadline."""


class CutOffSink:
    """Passes answer text on until `cut()`; after that, nothing."""

    def __init__(self, inner: TextSink) -> None:
        self.inner = inner
        self._lock = threading.Lock()
        self._cut = False

    def text(self, delta: str) -> None:
        with self._lock:
            if not self._cut:
                self.inner.text(delta)

    def reset(self) -> None:
        with self._lock:
            if not self._cut:
                self.inner.reset()

    def cut(self) -> None:
        with self._lock:
            self._cut = True


def within(
    seconds: float,
    call: Callable[[], T],
    *,
    tick: Callable[[float], None] | None = None,
    every: float = 5.0,
) -> T:
    """`call()`'s result or exception, if it comes within `seconds`; else Overdue. The call
    runs in a daemon thread with the caller's context (the log lines keep the run id). While
    it runs, `tick(seconds so far)` is called in the caller's thread every `every` seconds
    (so a surface can say how long the call has taken)."""
    started = time.monotonic()
    running = InThread(call, "model-call")
    while True:
        left = seconds - (time.monotonic() - started)
        if running.done.wait(max(0.0, min(left, every) if tick is not None else left)):
            break
        if time.monotonic() - started >= seconds:
            raise Overdue(f"not done within {seconds:.1f} s")
        if tick is not None:
            tick(time.monotonic() - started)
    return running.result()
