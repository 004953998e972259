"""Child processes (workers, the bot) under one parent that restarts a child that dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import structlog

log = structlog.get_logger(__name__)

RESTART_BACKOFF = (0.5, 1, 2, 5, 10, 30)


class Supervisor:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = {**os.environ, **(env or {})}
        self.children: dict[str, tuple[list[str], subprocess.Popen[bytes]]] = {}
        self.restarts: dict[str, int] = {}
        self.stopping = False

    def start(self, name: str, args: list[str]) -> None:
        command = [sys.executable, "-m", "switchboard", *args]
        self.children[name] = (command, subprocess.Popen(command, env=self.env))
        log.info("child_started", child=name, pid=self.children[name][1].pid)

    def watch(self, *, restart: bool = True) -> int:
        """Until a signal, restart children that exit, with backoff. With `restart=False`
        (burst workers), wait for every child to finish instead."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        while not self.stopping:
            if not restart and all(p.poll() is not None for _c, p in self.children.values()):
                return max(p.returncode for _c, p in self.children.values())
            for name, (command, proc) in list(self.children.items()):
                code = proc.poll()
                if code is None or self.stopping or not restart:
                    continue
                count = self.restarts.get(name, 0)
                delay = RESTART_BACKOFF[min(count, len(RESTART_BACKOFF) - 1)]
                log.warning("child_exited", child=name, code=code, restart_in=delay)
                time.sleep(delay)
                self.restarts[name] = count + 1
                self.children[name] = (command, subprocess.Popen(command, env=self.env))
            time.sleep(0.2)
        return self.stop()

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.stopping = True

    def stop(self, timeout: float = 20.0) -> int:
        self.stopping = True
        for _command, proc in self.children.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for name, (_command, proc) in self.children.items():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("child_killed", child=name)
                proc.kill()
                proc.wait()
        return 0
