"""A call in a daemon thread other than the caller's, with the caller's context: what a tool
call, a turn's extra reads and a model call held to its deadline are each run in.

A thread that makes such calls (a worker's slot, say) keeps one such thread between its
calls (`_Spare`) and hands its next call to it when it is idle, instead of starting a thread
per call: the hand-over measured about 40 µs of CPU against 110 µs for a thread started and
ended (a four-call run makes about seven such calls). So a process holds at most one idle
thread per thread that made such calls: a thread started by `InThread` keeps none, and a
call made while the spare is busy (a turn's second read, or a call that never returned) gets
a thread that ends with it, as every call did before. A spare ends with the thread that kept
it, or once it has been idle for `IDLE_SECONDS` (the next call starts another), so an idle
worker holds none: 1,000 slots' spares are ~30 MiB. What a call leaves in a thread-local is
seen by its keeper's later calls, other runs' and other people's: Switchboard keeps none
there (worker/model.py reads its own in the slot's thread), and the README tells tool authors
not to either.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import queue
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

IDLE_SECONDS = 0.5  # a spare idle this long ends; a slot's calls come milliseconds apart

# .spare: the calling thread's _Spare; .started: set in every thread InThread runs a call in
_kept = threading.local()


class _Line:
    """What a spare and its keeper share (the spare's thread holds this, not the `_Spare`,
    which goes with its keeper): the calls handed to it, and whether it is idle or ended."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: queue.SimpleQueue[Call | None] = queue.SimpleQueue()
        self.idle = True
        self.ended = False

    def done(self) -> None:
        """Its call is over (said before the caller learns it: its next call may come)."""
        with self.lock:
            self.idle = True


Call = Callable[[_Line | None], None]  # a call as handed over: told the spare's line, if any


class _Spare:
    """A daemon thread that runs the calls of the thread that keeps it, one at a time."""

    def __init__(self) -> None:
        self.pid = os.getpid()  # a forked child has the thread-local but not the thread
        self.line = line = _Line()
        weakref.finalize(self, line.calls.put, None)  # its keeper ended (or dropped it): stop
        self.thread = threading.Thread(target=_serve, args=(line,), name="spare", daemon=True)
        self.thread.start()

    @classmethod
    def take(cls, call: Call) -> bool:
        """Whether the calling thread's spare (started the first time, and again after one
        ended) took `call`; False while it is busy, and in a thread that runs an InThread
        call (its nested calls end with it)."""
        if getattr(_kept, "started", False):
            return False
        spare: _Spare | None = getattr(_kept, "spare", None)
        if spare is None or spare.pid != os.getpid() or spare.line.ended:
            spare = _kept.spare = cls()
        line = spare.line
        with line.lock:
            if not line.idle or line.ended:  # busy; or it ended idle just now: rare
                return False
            # the call before the mark: an exception between the two (the watchdog's, in the
            # slot) leaves a call that is run, and the spare marked idle until it is done: a
            # call handed to it meanwhile waits for that one, once
            line.calls.put(call)
            line.idle = False
        return True


def _serve(line: _Line) -> None:
    _kept.started = True
    try:
        while True:
            try:
                call = line.calls.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                with line.lock:
                    if line.idle:  # nobody handed it a call: it ends (its keeper starts another)
                        line.ended = True
                        return
                continue  # a call was handed to it as the wait ran out: it is in the queue
            if call is None:
                return
            try:
                call(line)
            except BaseException as exc:  # an `on_end` that raised: said as a thread's would be
                _report(exc)
            call = None  # let go of the call's frames while idle
            threading.current_thread().name = "spare"
    finally:
        with line.lock:
            line.ended = True  # no call is handed to it from here on
        while True:  # and one handed to it before, should it stop for a reason not foreseen,
            try:  # runs all the same, in a thread of its own
                left = line.calls.get_nowait()
            except queue.Empty:
                break
            if left is not None:
                threading.Thread(target=left, args=(None,), daemon=True).start()


def green() -> bool:
    """Whether this process's threads are gevent's greenlets on one OS thread (a worker's
    default, worker/pool.py): what asyncio, whose running loop is per OS thread, must know."""
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and bool(monkey.is_module_patched("threading"))


def _report(exc: BaseException) -> None:
    """As a thread that died of `exc` would say it (its frames are let go on return); a hook
    that fails is ignored, as `threading` does, so the spare serves on."""
    args = (type(exc), exc, exc.__traceback__, threading.current_thread())
    with contextlib.suppress(BaseException):  # a broken hook, or stderr gone: nowhere to say it
        threading.excepthook(threading.ExceptHookArgs(args))


class InThread(Generic[T]):
    """`call()` run in a daemon thread other than the caller's, with the caller's context
    (the log lines keep the run id, spans their parent): the caller's spare when it is idle,
    else a thread started for it. `done` is set when it has returned or raised, and
    `result()` then gives what it returned or raises what it raised. `on_end()` runs in that
    thread as it ends, after `done`: it must be quick (a release), since the caller's next
    call may wait for it in the spare."""

    def __init__(
        self, call: Callable[[], T], name: str, on_end: Callable[[], object] | None = None
    ) -> None:
        self.done = threading.Event()
        self._outcome: list[T] = []
        self._failure: list[BaseException] = []
        context = contextvars.copy_context()

        def run(line: _Line | None) -> None:
            threading.current_thread().name = name
            _kept.started = True
            try:
                self._outcome.append(context.run(call))
            except BaseException as exc:  # handed to the caller, who raises it as its own
                self._failure.append(exc)
            finally:
                if line is not None:
                    line.done()  # before `done`: the caller's next call may take the spare
                self.done.set()
                if on_end is not None:
                    on_end()

        if not _Spare.take(run):
            threading.Thread(target=run, args=(None,), name=name, daemon=True).start()

    def result(self) -> T:
        """Once `done`: what the call returned, or its exception raised here."""
        if self._failure:
            raise self._failure[0]
        return self._outcome[0]
