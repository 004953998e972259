"""tools.threads.InThread: a call in a thread of its own, held by the caller to a deadline;
each calling thread hands its calls to one kept thread while that thread is idle."""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from tools.threads import InThread

T = TypeVar("T")
who: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


def ran(call: InThread[T]) -> T:
    assert call.done.wait(10)
    return call.result()


def until(predicate: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "not seen in time"
        time.sleep(0.01)


def test_calls_run_in_one_kept_thread_with_the_callers_context_and_hand_back_what_they_did() -> (
    None
):
    def failing() -> None:
        raise KeyError("gone")

    def caller() -> None:
        who.set("alice")
        seen = [ran(InThread(lambda: (threading.get_ident(), who.get()), "c")) for _ in range(3)]
        assert {s[1] for s in seen} == {"alice"}
        assert len({s[0] for s in seen}) == 1 and seen[0][0] != threading.get_ident()
        with pytest.raises(KeyError, match="gone"):
            ran(InThread(failing, "c"))
        assert ran(InThread(threading.get_ident, "c")) == seen[0][0]  # still kept after
        results.append("ok")

    results: list[str] = []
    thread = threading.Thread(target=caller)
    thread.start()
    thread.join(10)
    assert results == ["ok"]


def test_a_call_that_does_not_return_holds_its_thread_and_the_next_calls_run_elsewhere() -> None:
    release = threading.Event()
    hung = InThread(lambda: (release.wait(10), threading.get_ident())[1], "hung")
    assert not hung.done.wait(0.05)

    others = {ran(InThread(threading.get_ident, "next")) for _ in range(3)}

    release.set()
    kept = ran(hung)
    assert kept not in others  # each ran in a thread started for it
    assert ran(InThread(threading.get_ident, "after")) == kept  # idle again: handed to it


def test_an_on_end_that_raises_is_reported_and_the_kept_thread_serves_on() -> None:
    reported: list[BaseException | None] = []
    before = threading.excepthook
    threading.excepthook = lambda args: reported.append(args.exc_value)
    try:
        first = InThread(threading.get_ident, "c", on_end=lambda: 1 / 0)
        assert first.done.wait(10)
        until(lambda: reported)
        assert ran(InThread(threading.get_ident, "c")) == first.result()
    finally:
        threading.excepthook = before
    assert isinstance(reported[0], ZeroDivisionError)


def test_the_kept_thread_ends_with_the_thread_that_kept_it() -> None:
    kept: list[threading.Thread] = []

    def caller() -> None:
        ident = ran(InThread(threading.get_ident, "c"))
        kept.extend(t for t in threading.enumerate() if t.ident == ident)

    thread = threading.Thread(target=caller)
    thread.start()
    thread.join(10)
    assert len(kept) == 1
    until(lambda: not kept[0].is_alive())
