"""One asyncio event loop per process, in a daemon thread, for the MCP client sessions.

The `mcp` SDK is asynchronous (anyio): a session must be entered and exited in one task of
one event loop. Tool handlers, though, are called synchronously, from many threads at once
(every worker slot, and each read of a model turn in its own thread). So the sessions live
in this loop, and a handler hands it a coroutine and waits for the answer
(`asyncio.run_coroutine_threadsafe(...).result(timeout)`); the GIL is released while it
waits. A loop started in a process that later forks belongs to the parent: `shared_loop()`
starts a new one in the child.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from tools.threads import green

T = TypeVar("T")


class EventLoopThread:
    """An event loop running forever in a daemon thread of its own."""

    def __init__(self, name: str = "mcp-loop") -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @property
    def alive(self) -> bool:
        return self.pid == os.getpid() and self.thread.is_alive() and not self.loop.is_closed()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None) -> T:
        """Run `coroutine` in the loop and wait for it; after `timeout` seconds it is
        cancelled (in the loop) and TimeoutError is raised. Never call from the loop."""
        if threading.current_thread() is self.thread:
            coroutine.close()
            raise RuntimeError(
                "EventLoopThread.run called from its own loop: it would wait forever"
            )
        future = self.submit(coroutine)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer within {timeout or 0:g} s") from None
        except BaseException:  # the waiter stopped (a job's timeout thrown into its greenlet,
            future.cancel()  # worker/pool.py): the coroutine must not run on without it
            raise

    def stop(self, timeout: float = 5.0) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout)


_shared: EventLoopThread | None = None
_lock = threading.Lock()


def shared_loop() -> EventLoopThread:
    """This process's loop for MCP sessions, started on first use."""
    global _shared
    with _lock:
        if _shared is None or not _shared.alive:
            _shared = EventLoopThread()
        return _shared


def run_to_end(coroutine: Coroutine[Any, Any, T]) -> T:
    """A coroutine run to its end from synchronous code (an async tool's handler, say):
    `asyncio.run` in an OS thread of its own; in a process whose threads are gevent's
    greenlets (worker/pool.py) they all share one OS thread, where asyncio sees the shared
    loop running already, so it runs there instead."""
    if not green():
        return asyncio.run(coroutine)
    return shared_loop().run(coroutine, None)
