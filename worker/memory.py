"""A worker process's memory between bursts: fewer malloc arenas, and free memory handed back
to the system each time the process goes idle (issue 28: flat RSS over many bursts).

What grows (measured with bench/bench_latency.py, 30 bursts of 100 runs at concurrency 128):
not Python objects (tracemalloc and pymalloc's own statistics are flat from the second burst
on, and so are the Redis connections, 130), but glibc's heaps. glibc gives each new thread an
arena of its own until there are 8 per core; the slots, the tool threads and the thread each
model call runs in (worker/deadline.py) allocate in one arena and free in another, so the
arenas fill with free chunks glibc keeps (it gives back only the top of a heap). Under the
GIL the arenas buy no parallelism worth having: Python allocates with the GIL held.

- `limit_arenas` (mallopt M_ARENA_MAX at start-up, before the slots start): one arena for
  every thread, so free memory is reused by whichever thread allocates next;
- `trim` (malloc_trim(0)) releases the free pages inside the heaps, once per idle period
  (`IdleHook`, called by the process's main loop), never while a run is in flight. It takes
  about 1 ms for a worker of 140 MiB.

Measured together (workers' RSS at rest, bursts 5 -> 30): 149.8 -> 156.0 MiB before,
140.1 -> 143.1 MiB after (+0.9 MiB over the last 10 bursts). Either alone lowers the level
more than the slope. Part of what still grew was a pool of tool threads that only grew (168
-> 193 threads over those bursts); tool calls now use threads that end with them
(worker/executor.py `run_reads`): 138.0 -> 140.1 MiB over bursts 5 to 30. A slot now hands
its calls to one kept thread, which ends after 0.5 s idle (tools/threads.py): at most one per
slot during a burst, none at rest.

- `reexec_with_tunables`: glibc gives every thread a cache of the chunks it freed (tcache: up
  to 7 of each of 64 sizes), which count as in use, so neither another thread nor `trim`
  gets them back. At 1,000 slots that was most of what a worker kept from one burst to the
  next: at rest after each of 5 bursts of 1,000 runs (`--concurrency 1000`, 2 s a model
  call), +17.7, +6.4, +2.1, +3.2 MiB a burst with the caches, +6.6, +4.1, +0.2, +0.3 without,
  and 262.7 against 216.8 MiB after the fifth; worker CPU per run within the noise of two
  pairs. glibc reads the setting only as a process starts, so `switchboard worker` starts
  itself again (same PID, same arguments) with it in GLIBC_TUNABLES, once; the started
  process puts back the GLIBC_TUNABLES it was given, so its children (the embedded Redis,
  RQ's scheduler, tools) start as the operator set them.

All are glibc's; elsewhere (musl, macOS) they do nothing and say so (False).

And Python's own collector (`settle_collector`, `release`): at 1,000 runs in one process its
full collections (5 a burst, 0.27 s each, every run of the process stopped meanwhile) and the
younger ones took 2.55 s of CPU over two bursts, most of it walking what start-up made and
nothing frees (modules, classes, the tool registry). Those are frozen out of its sight once
the worker is up, and the youngest generation is collected every 10,000 allocations instead
of 700: 0.63 s over the same two bursts, no full collection during them; what was not frozen
is collected when the process goes idle instead (at most once a minute), with nothing waiting
on it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

ARENAS = 1  # malloc arenas for a worker process (see above)
GC_YOUNG = 10_000  # allocations between collections of the youngest generation (Python: 700)
GC_IDLE_EVERY = 60.0  # s: at most this often a full collection as the process goes idle
MIN_INTERVAL = 1.0  # seconds between two releases, however often the process goes idle
_M_ARENA_MAX = -8  # glibc's malloc.h
TCACHE = "glibc.malloc.tcache_count"
TUNABLES = "GLIBC_TUNABLES"
GIVEN = "SWITCHBOARD_GLIBC_TUNABLES_GIVEN"  # what the process was started with, to put back


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library, when it is glibc (it has malloc_trim and mallopt); else None."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    if not (hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt")):
        return None
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim.restype = ctypes.c_int
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc


def available() -> bool:
    """Whether this process's allocator is glibc's (the functions below do something)."""
    return _glibc() is not None


def limit_arenas(count: int = ARENAS) -> bool:
    """At most `count` malloc arenas from now on (threads that already have one keep it).
    True when applied."""
    libc = _glibc()
    return libc is not None and libc.mallopt(_M_ARENA_MAX, max(1, count)) == 1


def tuned_environment(environ: Mapping[str, str]) -> dict[str, str] | None:
    """`environ` with the threads' caches turned off (see above), added to any tunables the
    operator set; None when there is nothing to add: the operator set that one already (any
    value is theirs to choose), or the allocator is not glibc's."""
    current = environ.get(TUNABLES, "")
    if any(t.split("=", 1)[0] == TCACHE for t in current.split(":")) or not available():
        return None
    return {**environ, TUNABLES: f"{current}:{TCACHE}=0" if current else f"{TCACHE}=0"}


def reexec_with_tunables() -> None:
    """Start this process again, same PID and command line, in `tuned_environment`; returns
    when there is nothing to change, it could not, or it is the process started again (which
    then puts back the GLIBC_TUNABLES it was given: glibc has read the setting)."""
    if GIVEN in os.environ:
        given = os.environ.pop(GIVEN)
        if given:
            os.environ[TUNABLES] = given
        else:
            os.environ.pop(TUNABLES, None)
        return
    environ = tuned_environment(os.environ)
    if environ is None or sys.gettrace() is not None or sys.orig_argv[1:2] == ["-"]:
        return  # under a debugger (it would lose its session) or a script read from stdin
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    environ[GIVEN] = os.environ.get(TUNABLES, "")
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environ)
    except OSError as exc:  # goes on as it is: only its memory is affected
        print(f"switchboard: could not start again with {TCACHE}=0: {exc}", file=sys.stderr)


def trim() -> bool:
    """Give the free memory of every malloc arena back to the system (malloc_trim(0): also the
    free pages inside a heap, not only its top). True when some was released."""
    libc = _glibc()
    return libc is not None and libc.malloc_trim(0) == 1


def rss_kib() -> int:
    """This process's resident set, in KiB (0 where /proc is not)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * (_page_size() // 1024)
    except (OSError, IndexError, ValueError):
        return 0


def _log() -> Any:
    """structlog's logger, imported when first used: `switchboard worker` imports this module
    to start itself again before gevent patches it (worker/pool.py), which must come before
    ssl is imported, and structlog's import brings ssl (through its console renderer)."""
    import structlog

    return structlog.get_logger(__name__)


@functools.cache
def _page_size() -> int:
    import resource

    return resource.getpagesize()


def settle_collector() -> int:
    """Once the worker is up: what is alive now stays (start-up's modules, classes, registry),
    so the collector stops walking it (gc.freeze), and collects the youngest generation less
    often (see above). The number of objects frozen."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG, *gc.get_threshold()[1:])
    return gc.get_freeze_count()


_collected_at = -math.inf


def release() -> None:
    """A full collection (of what was not frozen; at most every GC_IDLE_EVERY seconds: at
    1,000 slots one takes 60-100 ms, and a trickle of runs made the process go idle every
    second or two, found by review), then `trim`, with what they gave back in a debug line."""
    global _collected_at
    before, started = rss_kib(), time.perf_counter()
    collected = None
    if time.monotonic() - _collected_at >= GC_IDLE_EVERY:
        collected = gc.collect()
        _collected_at = time.monotonic()
    released = trim()
    after = rss_kib()
    _log().debug(
        "worker_memory_released",
        collected=collected,
        released=released,
        rss_kib=after,
        freed_kib=before - after,
        ms=round((time.perf_counter() - started) * 1000, 2),
    )


class IdleHook:
    """Runs `action` once each time the process goes idle (no slot busy) after being busy:
    `observe(busy)` at every turn of the main loop. Never while busy; at most once per
    `min_interval` seconds (an idle period that comes sooner is served when that has passed,
    if the process is still idle then)."""

    def __init__(
        self,
        action: Callable[[], object] = release,
        *,
        min_interval: float = MIN_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.action = action
        self.min_interval = min_interval
        self.clock = clock
        self.ticks = 0  # observations so far
        self.runs = 0  # times `action` ran
        self._pending = False  # busy since the last run
        self._last: float | None = None

    def observe(self, busy: bool) -> bool:
        """One look at the process; True when `action` ran."""
        self.ticks += 1
        if busy:
            self._pending = True
            return False
        if not self._pending:
            return False
        now = self.clock()
        if self._last is not None and now - self._last < self.min_interval:
            return False
        self._pending = False
        self._last = now
        try:
            self.action()
        except Exception:  # the main loop must go on: releasing memory is never worth a stop
            _log().exception("worker_idle_hook_failed")
        self.runs += 1
        return True
