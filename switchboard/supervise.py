"""Child processes (workers, the bot) under one parent, and which workers are alive.

Children run in their own sessions, so a terminal's Ctrl-C reaches only the parent, which
stops them in order: SIGTERM (a worker hands its runs back to the queue at their next step),
after a grace period a second SIGTERM (stop now), then SIGKILL. A second Ctrl-C skips the
grace period. Each child holds the read end of a pipe whose write end only the parent has
(the lifeline): when the parent dies, even by kill -9 or with its terminal, the child sees
end-of-file and stops itself, so no child outlives its parent. A child that exits is
restarted with backoff, except after a configuration error (exit status 2), which no
restart can fix: then everything stops with that error. A Redis that does not answer (exit
status 75, after the child's own wait) is not one: that child is restarted with backoff
while the others go on.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog
from rq import Queue, Worker

from switchboard import errors

log = structlog.get_logger(__name__)

LIFELINE_ENV = "SWITCHBOARD_LIFELINE"
RESTART_BACKOFF = (0.5, 1, 2, 5, 10, 30)
# A child that ran this long before it exited starts its back-off over: after an outage
# (Redis down, and the child restarted into it a few times), a crash days later was
# restarted only 30 s on
STEADY_SECONDS = 60.0
SERVICE_GRACE = 27.0  # a worker's own grace is 25 s; Kubernetes waits 30 s before SIGKILL
KILL_AFTER = 3.0  # after the second SIGTERM
KILL_AFTER_HURRY = 1.0  # ... when a person asked twice: "a second Ctrl-C stops at once"
# An idle RQ worker heartbeats every 45 s (worker_ttl 60 - 15, see worker/process.py); a
# busy SimpleWorker slot does not heartbeat until its job ends.
HEARTBEAT_FRESH = 75.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class Child:
    name: str
    args: list[str]
    log: Path | None
    proc: subprocess.Popen[bytes]
    restart_at: float | None = None
    restarts: int = field(default=0)
    started: float = field(default_factory=time.monotonic)  # its last (re)start

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


class Supervisor:
    def __init__(
        self, env: dict[str, str] | None = None, notify: Callable[[str], None] | None = None
    ) -> None:
        self.env = {**os.environ, **(env or {})}
        self.children: dict[str, Child] = {}
        self.notify = notify or (lambda _text: None)
        self.stopping = False
        self.hurry = False  # a second signal: skip the grace period
        self.failed: str | None = None  # the child that stopped with a configuration error
        self._lifeline, self._lifeline_keep = os.pipe()  # we never write; children read

    def start(self, name: str, args: list[str], *, log_file: Path | None = None) -> Child:
        """Start `python -m switchboard ARGS`; its output goes to `log_file` when given."""
        child = Child(name, args, log_file, self._spawn(args, log_file))
        self.children[name] = child
        log.info("child_started", child=name, pid=child.proc.pid)
        return child

    def _spawn(self, args: list[str], log_file: Path | None) -> subprocess.Popen[bytes]:
        out = None
        if log_file is not None:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            out = open(log_file, "ab")  # noqa: SIM115 - the child keeps its own copy
        try:
            return subprocess.Popen(
                [sys.executable, "-m", "switchboard", *args],
                env={**self.env, LIFELINE_ENV: str(self._lifeline)},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if out else None,
                start_new_session=True,
                pass_fds=(self._lifeline,),
            )
        finally:
            if out is not None:
                out.close()

    def restart(self, child: Child) -> None:
        child.restarts += 1
        child.restart_at = None
        child.proc = self._spawn(child.args, child.log)
        child.started = time.monotonic()
        log.info("child_restarted", child=child.name, pid=child.proc.pid)

    @contextlib.contextmanager
    def signals(self) -> Iterator[None]:
        """SIGINT/SIGTERM ask the supervisor to stop (`watch` then stops the children), from
        here on: entered before the children start, a Ctrl-C while they do is not lost as a
        KeyboardInterrupt that leaves them behind."""
        previous = _handle(STOP_SIGNALS, self._on_signal)
        try:
            yield
        finally:
            _restore(previous)

    def watch(self, *, restart: bool = True) -> int:
        """Until a signal, restart children that exit, with backoff. With `restart=False`
        (burst workers), wait for every child to finish instead."""
        with self.signals():
            while not self.stopping:
                if not restart and not any(c.alive for c in self.children.values()):
                    return max(c.proc.returncode for c in self.children.values())
                if restart:
                    self._tend()
                time.sleep(0.1)
            self.stop()
        return errors.CONFIG_EXIT if self.failed else 0

    def _tend(self) -> None:
        now = time.monotonic()
        for child in self.children.values():
            code = child.proc.poll()
            if code is None or self.stopping:
                continue
            if code == errors.CONFIG_EXIT:
                self.failed = child.name
                print(errors.child_failed(child.name), file=sys.stderr)
                self.stopping = True
                return
            if child.restart_at is None:
                if now - child.started >= STEADY_SECONDS:  # it ran steadily: not a crash loop
                    child.restarts = 0
                delay = RESTART_BACKOFF[min(child.restarts, len(RESTART_BACKOFF) - 1)]
                log.warning("child_exited", child=child.name, code=code, restart_in=delay)
                child.restart_at = now + delay
            elif now >= child.restart_at:
                self.restart(child)

    def _on_signal(self, _signum: int, _frame: object) -> None:
        if self.stopping:
            self.hurry = True
        self.stopping = True

    def hurry_on_signal(self, _signum: int, _frame: object) -> None:
        """A signal while stopping: skip the grace period."""
        self.hurry = True

    def stop(self, grace: float = SERVICE_GRACE) -> int:
        """SIGTERM every child; after `grace` seconds (or at a second Ctrl-C) SIGTERM again,
        which stops a worker at once; SIGKILL what is left `KILL_AFTER` seconds later."""
        self.stopping = True
        previous = _handle(STOP_SIGNALS, self.hurry_on_signal)
        try:
            self._signal_all(signal.SIGTERM)
            deadline = time.monotonic() + grace
            second: float | None = None
            while any(c.alive for c in self.children.values()):
                now = time.monotonic()
                if second is None and (self.hurry or now >= deadline):
                    if self.hurry:
                        self.notify("Stopping now.")
                    self._signal_all(signal.SIGTERM)
                    second = now
                elif second is not None and now - second >= (
                    KILL_AFTER_HURRY if self.hurry else KILL_AFTER
                ):
                    for child in self.children.values():
                        if child.alive:
                            log.warning("child_killed", child=child.name)
                            child.proc.kill()
                    break
                time.sleep(0.05)
            for child in self.children.values():
                child.proc.wait()
        finally:
            _restore(previous)
        return 0

    def _signal_all(self, sig: signal.Signals) -> None:
        for child in self.children.values():
            if child.alive:
                child.proc.send_signal(sig)


def _handle(signals: tuple[signal.Signals, ...], handler: Any) -> dict[signal.Signals, Any]:
    """Install `handler` (only the main thread may); returns what to restore."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, handler) for sig in signals}


def _restore(previous: dict[signal.Signals, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def watch_lifeline() -> None:
    """In a child: stop like on SIGTERM when the parent that started us is gone."""
    fd = os.environ.pop(LIFELINE_ENV, "")  # our own children get lifelines of their own
    if fd.isdigit():
        threading.Thread(
            target=_wait_for_parent, args=(int(fd),), name="lifeline", daemon=True
        ).start()


def _wait_for_parent(fd: int) -> None:
    try:
        while True:
            # waits in `select`, which gevent makes a wait on its event loop in a worker of
            # that pool (worker/pool.py): a read that blocked would stop the whole process
            select.select([fd], [], [])
            if not os.read(fd, 1):  # the parent never writes: end-of-file when it is gone
                break
    except OSError:
        pass
    log.warning("parent_gone", pid=os.getpid())
    os.kill(os.getpid(), signal.SIGTERM)  # a worker hands its runs back to the queue
    time.sleep(SERVICE_GRACE)
    os.kill(os.getpid(), signal.SIGTERM)  # the second: stop now


def live_workers(queue: Queue) -> set[str]:
    """The worker processes taking jobs from `queue` ("host.pid"), checked, not counted.

    A killed worker stays registered with RQ until its key's TTL ends (minutes while it held
    a job) and a live worker cleans the registry, so RQ's count would name workers long
    dead. On this host the process table says whether a worker's pid runs; elsewhere its
    heartbeat must be recent, or it must be busy (a busy slot does not heartbeat).
    """
    host = socket.gethostname()
    now = datetime.now(UTC)
    alive = set()
    for worker in Worker.all(queue=queue):
        ident = f"{worker.hostname}.{worker.pid}"
        if ident in alive or not worker.pid:
            continue
        if worker.hostname == host:
            running = worker.pid != os.getpid() and pid_running(worker.pid)
        else:
            beat = worker.last_heartbeat
            fresh = beat is not None and (now - beat).total_seconds() < HEARTBEAT_FRESH
            running = fresh or worker.get_state() == "busy"
        if running:
            alive.add(ident)
    return alive


def pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    try:  # a zombie answers kill(0) too: it has exited, its parent has not reaped it yet
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # not Linux, or it is gone now
        return Path("/proc").is_dir() is False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def last_line(path: Path | None) -> str:
    """The last non-empty line of a child's log, for a one-line report."""
    if path is None or not path.is_file():
        return ""
    with path.open("rb") as handle:
        handle.seek(max(0, path.stat().st_size - 4096))
        lines = [line.strip() for line in handle.read().decode(errors="replace").splitlines()]
    return next((line for line in reversed(lines) if line), "")
