"""tools.threads.InThread: a call in a thread of its own, held by the caller to a deadline;
each calling thread hands its calls to one kept thread while that thread is idle.

Threads are compared as objects, kept referenced, never by ident (a new thread may reuse the
ident of one that ended). Each case runs in a caller thread of its own, so no case sees a
kept thread another case left busy."""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from tools import threads
from tools.threads import InThread

T = TypeVar("T")
who: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


@pytest.fixture(autouse=True)
def spares_stay(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spares do not end idle here (a loaded machine may pause a case longer than the 0.5 s
    of production), except where a case sets its own idle time."""
    monkeypatch.setattr(threads, "IDLE_SECONDS", 60.0)


def ran(call: InThread[T]) -> T:
    assert call.done.wait(10)
    return call.result()


def until(predicate: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "not seen in time"
        time.sleep(0.01)


def in_a_thread(case: Callable[[], None]) -> threading.Thread:
    """Run `case` in a new caller thread; raise here what it raised. Returns the thread."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            case()
        except BaseException as exc:
            failed.append(exc)

    caller = threading.Thread(target=run)
    caller.start()
    caller.join(20)
    assert not caller.is_alive()
    if failed:
        raise failed[0]
    return caller


def test_calls_run_in_one_kept_thread_with_the_callers_context_and_hand_back_what_they_did() -> (
    None
):
    def failing() -> None:
        raise KeyError("gone")

    def case() -> None:
        who.set("alice")
        seen = [ran(InThread(lambda: (threading.current_thread(), who.get()), "c")) for _ in "abc"]
        assert [s[1] for s in seen] == ["alice"] * 3
        kept = seen[0][0]
        assert all(s[0] is kept for s in seen) and kept is not threading.current_thread()
        with pytest.raises(KeyError, match="gone"):
            ran(InThread(failing, "c"))
        assert ran(InThread(threading.current_thread, "c")) is kept  # still kept after

    in_a_thread(case)


def test_a_call_that_does_not_return_holds_its_thread_and_the_next_calls_run_elsewhere() -> None:
    def case() -> None:
        release = threading.Event()
        hung = InThread(lambda: (release.wait(10), threading.current_thread())[1], "hung")
        assert not hung.done.wait(0.05)

        others = [ran(InThread(threading.current_thread, "next")) for _ in "abc"]

        release.set()
        kept = ran(hung)
        assert all(other is not kept for other in others)  # each in a thread started for it
        assert ran(InThread(threading.current_thread, "after")) is kept  # idle: handed to it

    in_a_thread(case)


def test_a_call_made_inside_a_call_runs_in_a_thread_that_ends_with_it() -> None:
    """A kept thread keeps none of its own: a process holds one per calling thread."""

    def case() -> None:
        def nested() -> tuple[threading.Thread, threading.Thread]:
            return threading.current_thread(), ran(InThread(threading.current_thread, "in"))

        outer, inner = ran(InThread(nested, "out"))
        assert inner is not outer
        until(lambda: not inner.is_alive())
        assert ran(InThread(threading.current_thread, "again")) is outer

    in_a_thread(case)


def test_an_on_end_that_raises_is_reported_and_the_kept_thread_serves_on_then_ends() -> None:
    reported: list[type[BaseException]] = []
    kept: list[threading.Thread] = []
    before = threading.excepthook
    threading.excepthook = lambda args: reported.append(args.exc_type)

    def case() -> None:
        first = InThread(threading.current_thread, "c", on_end=lambda: 1 / 0)
        kept.append(ran(first))
        until(lambda: reported)
        assert ran(InThread(threading.current_thread, "c")) is kept[0]

    try:
        in_a_thread(case)
    finally:
        threading.excepthook = before
    assert reported == [ZeroDivisionError]
    until(lambda: not kept[0].is_alive(), timeout=5)  # the report let go of call and spare


def test_the_kept_thread_ends_with_the_thread_that_kept_it() -> None:
    kept: list[threading.Thread] = []
    in_a_thread(lambda: kept.append(ran(InThread(threading.current_thread, "c"))))

    until(lambda: not kept[0].is_alive(), timeout=5)  # not idle long enough to end for that


def test_an_idle_spare_ends_and_the_next_call_gets_a_spare_that_is_kept_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An idle worker holds no spares: each ends after IDLE_SECONDS without a call."""
    monkeypatch.setattr(threads, "IDLE_SECONDS", 0.2)

    def case() -> None:
        first = ran(InThread(threading.current_thread, "c"))
        until(lambda: not first.is_alive())
        second = ran(InThread(threading.current_thread, "c"))
        assert second is not first
        assert ran(InThread(threading.current_thread, "c")) is second

    in_a_thread(case)


def test_no_call_is_lost_when_a_spare_ends_as_it_is_handed_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Spares that end after 1 ms idle, handed calls at gaps around that: a call handed as
    the wait runs out is run (the spare goes on), never left in the queue of one that ended."""
    monkeypatch.setattr(threads, "IDLE_SECONDS", 0.001)

    def case() -> None:
        ran_in: set[threading.Thread] = set()
        for n in range(2000):
            if n % 3:
                time.sleep(0.0005 * (n % 5))
            call = InThread(threading.current_thread, "c")
            assert call.done.wait(5), f"call {n} was not run"
            ran_in.add(call.result())
        assert len(ran_in) > 1  # spares did end and were started again

    in_a_thread(case)


def test_a_spare_whose_report_fails_serves_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """An `on_end` that raises, with a thread hook that raises too (a broken hook, stderr
    gone): the spare neither dies with its next call handed to it nor loses that call."""

    def broken(args: threading.ExceptHookArgs) -> None:
        raise OSError("stderr is gone")

    monkeypatch.setattr(threading, "excepthook", broken)

    def case() -> None:
        kept = ran(InThread(threading.current_thread, "c", on_end=lambda: 1 / 0))
        until(lambda: kept.name == "spare")  # back from the failed report, idle
        assert kept.is_alive()
        assert ran(InThread(threading.current_thread, "c")) is kept

    in_a_thread(case)
