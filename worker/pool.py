"""How a worker process carries many runs at once: its slots as greenlets on one gevent hub
(`gevent`, the default), or as OS threads (`threads`, the default for a process of one slot).

A run waits on sockets almost all its working time (the model's HTTP answer, Redis), and the
slots' code is the same either way: RQ `SimpleWorker` loops (worker/process.py) over the
synchronous openai SDK transport and redis-py. Under `gevent` the process's sockets, locks,
sleeps and threads are gevent's (`monkey.patch_all`, applied before anything else is
imported, see `switchboard.cli.main`), so every wait hands over to the next ready slot on one
event loop in the main thread, instead of releasing the GIL for another OS thread to take:
no GIL hand-offs between hundreds of threads, no thread stacks. Measured (bench/README.md,
bench_latency.py, alternated on one machine): 1,000 runs at 2 s a call in ONE process took
12.4-20.3 s and 11-17 s of CPU under `gevent` against 19.2-55.8 s and 19-54 s under
`threads`, within 1.1-1.4x of four processes of 250; the default burst of 100 runs 1.0-1.3 s
of CPU against 1.6 s. At one slot, with nothing to switch between, it is the other way round: each
wait through the event loop costs more than a thread's blocking call (17.5-18.1 against
11.7-13.5 ms of CPU a run), so a process of one slot runs in threads unless told otherwise.

The price is the one every gevent program pays (Celery's `-P gevent`, gunicorn's gevent
workers): code that blocks without yielding (a C extension's own socket or a long
computation) holds up every run in the process while it does. Switchboard's own I/O is
Python sockets; a tool that calls a database through a C driver, or computes for long,
belongs in a process of `--pool threads`.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import threading
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

POOLS = ("gevent", "threads")
ENV = "SWITCHBOARD_WORKER_POOL"
CONCURRENCY_ENV = "SWITCHBOARD_WORKER_CONCURRENCY"
FIELD_NAMES = {ENV: "WORKER_POOL", CONCURRENCY_ENV: "WORKER_CONCURRENCY"}  # Config's fields
ENV_FILE = ".env"  # where Config (pydantic-settings) reads it too, from the current folder
BLOCKED_AFTER = 1.0  # s without a switch on the event loop: said (a run's lease is 15 s)
WHERE_FRAMES = 4  # innermost frames named when it is


def requested(
    args: Sequence[str], environ: Mapping[str, str] = os.environ, env_file: str = ENV_FILE
) -> str | None:
    """The pool a `switchboard worker` command line asks for, read before anything else is
    imported, as the worker's parser and Config will read it: `--pool` (abbreviated as
    argparse allows), else SWITCHBOARD_WORKER_POOL in the environment, else in the .env file,
    else its field's name WORKER_POOL likewise (names in any case, as pydantic-settings reads
    them), else `threads` for a process of one
    slot (`--concurrency`, SWITCHBOARD_WORKER_CONCURRENCY: nothing to switch between, and a
    thread's blocking call costs less CPU than a wait on the event loop) and `gevent` for
    more. None when the process only supervises others (`--processes` above 1: each child
    decides for itself) or a value is not one the parser or Config takes (they then refuse
    it with their message)."""
    try:
        given, _ = _Options().parse_known_args(list(args))
    except _Refused:
        return None
    if _number(given.processes) != 1:
        return None  # above 1, or refused
    pool = given.pool or _setting(ENV, environ, env_file)
    if pool is None:  # by the slots: one, or more (Config's default is 128)
        slots = given.concurrency or _setting(CONCURRENCY_ENV, environ, env_file) or "128"
        pool = "threads" if _number(slots) == 1 else "gevent"
    return pool if pool in POOLS else None


class _Refused(Exception):
    pass


class _Options(argparse.ArgumentParser):
    """The worker parser's options this needs, taken as it takes them, and anything else
    left alone; what it would refuse raises instead of ending the process."""

    def __init__(self) -> None:
        super().__init__(add_help=False)
        self.add_argument("--pool")
        self.add_argument("--processes", default="1")
        self.add_argument("--concurrency")

    def error(self, message: str) -> NoReturn:
        raise _Refused(message)


def _number(text: str) -> int | None:
    """A whole number as pydantic reads one ("1", " 1 ", "1.0"); None for anything else."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return None
    return int(number) if number.is_integer() else None


def _setting(name: str, environ: Mapping[str, str], env_file: str) -> str | None:
    """A setting's value as Config reads it: by its name in any case (the last one set wins),
    from the environment, else the .env file; then likewise by its field's name
    (`populate_by_name`: WORKER_POOL is read too, after SWITCHBOARD_WORKER_POOL)."""
    from_file = _from_env_file(env_file)
    for each in (name, FIELD_NAMES[name]):
        value = _named(each, environ) or _named(each, from_file)
        if value:
            return value
    return None


def _named(name: str, values: Mapping[str, str | None]) -> str | None:
    """As pydantic-settings looks a name up: lower-cased, the last one given wins (a line of
    the .env file with no value too)."""
    return {key.lower(): value for key, value in values.items()}.get(name.lower())


def _from_env_file(path: str) -> Mapping[str, str | None]:
    if not Path(path).is_file():
        return {}
    from dotenv import dotenv_values  # pydantic-settings' own reader of the file

    return dotenv_values(path)


def patch() -> None:
    """Make this process's sockets, locks, sleeps and threads gevent's. Call before anything
    that opens a socket or starts a thread is imported. gevent's monitor thread (a real one)
    says when the event loop did not switch for BLOCKED_AFTER seconds: some code blocked every
    run of the process (`worker_loop_blocked`, where it was)."""
    from gevent import config, events, monkey

    config.monitor_thread = True
    config.max_blocking_time = BLOCKED_AFTER
    config.print_blocking_reports = False  # said in the log instead, as one event
    monkey.patch_all()
    events.subscribers.append(_said_blocked)


def _said_blocked(event: object) -> None:
    """In gevent's monitor thread: an EventLoopBlocked, with where the loop's thread is."""
    from gevent.events import EventLoopBlocked

    if not isinstance(event, EventLoopBlocked):
        return
    import structlog

    hub = getattr(event, "hub", None)  # its thread: the main one (the OS thread's ident)
    frame = sys._current_frames().get(getattr(hub, "thread_ident", 0))
    at = [
        f"{Path(f.filename).name}:{f.lineno} {f.name}"
        for f in (traceback.extract_stack(frame)[-WHERE_FRAMES:] if frame else [])
    ]
    structlog.get_logger(__name__).warning(
        "worker_loop_blocked", seconds=event.blocking_time, at=at
    )


def active() -> str:
    """The pool this process runs its slots in."""
    from tools.threads import green  # not at the top: imported before `patch`, the `tools`
    # package (asyncio, ssl) and tools.threads' thread-local would be the OS thread's

    return "gevent" if green() else "threads"


def current() -> Any:
    """What `interrupt` needs to reach the caller: its greenlet, or its thread's id."""
    if active() == "gevent":
        import gevent

        return gevent.getcurrent()
    return threading.get_ident()


def interrupt(target: Any, exception: type[BaseException] | BaseException) -> None:
    """Raise `exception` in `target` (from `current()`, called there): a greenlet gets it
    where it waits; a thread (only an exception class, then) at its next Python instruction,
    after a blocking C call returns."""
    if isinstance(target, int):
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(target), ctypes.py_object(exception)
        )
        return
    import gevent

    gevent.kill(target, exception)


def name_of(target: Any) -> object:
    """How a log names `target`: a thread's id, a greenlet's small number."""
    return getattr(target, "minimal_ident", target)
