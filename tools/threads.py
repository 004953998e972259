"""A call in a daemon thread of its own, with the caller's context: what a tool call, a
turn's extra reads and a model call held to its deadline are each run in."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class InThread(Generic[T]):
    """`call()` started in a daemon thread of its own, with the caller's context (the log
    lines keep the run id, spans their parent); `done` is set when it has returned or
    raised, and `result()` then gives what it returned or raises what it raised.
    `on_end()` runs in that thread as it ends."""

    def __init__(
        self, call: Callable[[], T], name: str, on_end: Callable[[], object] | None = None
    ) -> None:
        self.done = threading.Event()
        self._outcome: list[T] = []
        self._failure: list[BaseException] = []
        context = contextvars.copy_context()

        def run() -> None:
            try:
                self._outcome.append(context.run(call))
            except BaseException as exc:  # handed to the caller, who raises it as its own
                self._failure.append(exc)
            finally:
                self.done.set()
                if on_end is not None:
                    on_end()

        threading.Thread(target=run, name=name, daemon=True).start()

    def result(self) -> T:
        """Once `done`: what the call returned, or its exception raised here."""
        if self._failure:
            raise self._failure[0]
        return self._outcome[0]
