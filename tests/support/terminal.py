"""A command in a pseudo-terminal, driven as a person would: type lines, press Ctrl-C, close
the window. Output is collected by a reader thread; `expect` waits for text to appear."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import signal
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _take_terminal() -> None:
    """In the child, after setsid: the pty becomes its controlling terminal, so Ctrl-C and
    a hang-up reach its foreground process group as they would in a real terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "switchboard", *args],
            env={**env, "TERM": "dumb"},
            cwd=cwd,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            preexec_fn=_take_terminal,
        )
        os.close(slave)
        self._text = ""
        self._seen = 0  # `expect` moves past what it matched
        self._cond = threading.Condition()
        self._closing = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            if self._closing.is_set():
                chunk = b""
            elif not select.select([self.master], [], [], 0.05)[0]:
                continue
            else:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:  # EIO: every process holding the terminal has gone
                    chunk = b""
            with self._cond:
                if not chunk:
                    self._text += "\0"  # end of output
                    self._cond.notify_all()
                    return
                self._text += ANSI.sub("", chunk.decode(errors="replace").replace("\r\n", "\n"))
                self._cond.notify_all()

    @property
    def output(self) -> str:
        with self._cond:
            return self._text.rstrip("\0")

    def expect(self, text: str, timeout: float = 30.0) -> str:
        """Wait until `text` appears after the last match; returns the output up to it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = self._text.find(text, self._seen)
                if found >= 0:
                    before = self._text[self._seen : found + len(text)]
                    self._seen = found + len(text)
                    return before
                left = deadline - time.monotonic()
                if left <= 0 or self._text.endswith("\0"):
                    raise AssertionError(
                        f"{text!r} did not appear; the terminal shows:\n{self._text[-3000:]}"
                    )
                self._cond.wait(left)

    def send(self, line: str) -> None:
        os.write(self.master, (line + "\n").encode())

    def interrupt(self) -> None:
        """Ctrl-C, through the terminal's line discipline: SIGINT to the foreground group."""
        os.write(self.master, b"\x03")

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def hang_up(self) -> None:
        """The terminal window is closed: the kernel sends SIGHUP to the session."""
        self._closing.set()
        self._reader.join(5)
        os.close(self.master)

    def kill9(self) -> None:
        """The process dies at once (its children, if any, are not told)."""
        self.proc.kill()
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._closing.set()
        self._reader.join(5)
        with contextlib.suppress(OSError):
            os.close(self.master)
