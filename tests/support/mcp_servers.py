"""Real MCP servers for tests: `mcp-server-time` from PyPI, and tests/support/mcp_server.py (a notes
service built with the SDK's MCPServer) over stdio or streamable HTTP on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]  # the project
SERVER = ROOT / "tests" / "support" / "mcp_server.py"
HOSTILE = ROOT / "tests" / "support" / "mcp_hostile_server.py"  # HOSTILE=flip|file|long|...


def installed(command: str) -> str:
    """A server installed with the test environment (`mcp-server-git`, `mcp-server-time`): the
    script beside the running Python, so the tests need no activated virtualenv on PATH."""
    path = Path(sys.executable).parent / command
    assert path.exists(), f"{command} is not installed beside {sys.executable}"
    return str(path)


class NotesServer:
    """tests/support/mcp_server.py over streamable HTTP, as a child process on a free port."""

    def __init__(self, notes_dir: Path, script: Path = SERVER, **env: str) -> None:
        self.dir = notes_dir
        port_file = notes_dir / f"port-{os.urandom(4).hex()}"
        self.log = open(notes_dir / "http-server.log", "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, str(script), "--http", str(port_file)],
            env={**os.environ, "NOTES_DIR": str(notes_dir), **env},
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        from tests.support.runtime import wait_until  # keeps conftest's imports light

        port = wait_until(
            lambda: port_file.exists() and port_file.read_text().strip(),
            timeout=30,
            what="the MCP HTTP server to listen",
        )
        self.url = f"http://127.0.0.1:{port}/mcp"

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        self.kill()
        self.log.close()


def stdio_notes(notes_dir: Path, **extra: Any) -> dict[str, Any]:
    """A `servers:` entry that starts tests/support/mcp_server.py over stdio; NOTES_DIR (set by the
    `notes_dir` fixture) goes through `${NOTES_DIR}`, as an operator's secrets would."""
    assert os.environ.get("NOTES_DIR") == str(notes_dir)
    return {
        "command": sys.executable,
        "args": [str(SERVER)],
        "env": {"NOTES_DIR": "${NOTES_DIR}"},
        **extra,
    }


def stdio_hostile(notes_dir: Path, mode: str, **extra: Any) -> dict[str, Any]:
    """A `servers:` entry that starts tests/support/mcp_hostile_server.py over stdio."""
    return {
        "command": sys.executable,
        "args": [str(HOSTILE)],
        "env": {"NOTES_DIR": str(notes_dir), "HOSTILE": mode},
        **extra,
    }


def write_config(path: Path, servers: dict[str, dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump({"servers": servers}, sort_keys=False), encoding="utf-8")
    return path


def starts(notes_dir: Path, tool: str, title: str | None = None) -> list[str | None]:
    """The idempotency keys of every start of `tool` (for `title`) the server recorded."""
    path = notes_dir / "notes.sqlite3"
    if not path.exists():
        return []
    with contextlib.closing(sqlite3.connect(path, timeout=10)) as db:
        rows = db.execute("SELECT title, key FROM starts WHERE tool = ?", (tool,)).fetchall()
    return [key for t, key in rows if title is None or t == title]
