"""Tools for fault tests, loaded by worker processes through SWITCHBOARD_TOOLS (listed in
`TOOLS`, so importing this module registers nothing: a test run that imports it without
running the fault tests leaves the shared registry as it was).

They announce that they started (a marker file), wait until the test releases them, and
count every start of the write in their own SQLite store, so a test can prove a write never
ran twice whatever was killed when.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from tools import ToolContext
from tools.declare import make_tool


def _dir() -> Path:
    return Path(os.environ["FAULT_DIR"])


def _db() -> sqlite3.Connection:
    db = sqlite3.connect(_dir() / "effects.sqlite3", timeout=10, isolation_level=None)
    db.execute("CREATE TABLE IF NOT EXISTS starts (name TEXT, key TEXT)")
    db.execute("CREATE TABLE IF NOT EXISTS done (key TEXT PRIMARY KEY, name TEXT)")
    return db


def _hold(marker: str) -> None:
    (_dir() / marker).touch()
    deadline = time.monotonic() + 20
    while not (_dir() / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def starts(folder: Path, name: str) -> int:
    os.environ.setdefault("FAULT_DIR", str(folder))
    with _db() as db:
        return int(db.execute("SELECT count(*) FROM starts WHERE name = ?", (name,)).fetchone()[0])


def slow_read(topic: str) -> str:
    """Look something up slowly.

    Args:
        topic: What to look up.
    """
    _hold(f"read-{topic}")
    return f"facts about {topic}"


def _reconcile(ctx: ToolContext, args: dict[str, Any]) -> str | None:
    with _db() as db:
        row = db.execute("SELECT name FROM done WHERE key = ?", (ctx.idempotency_key,)).fetchone()
    return f"wrote {row[0]}" if row else None


def slow_write(ctx: ToolContext, name: str) -> str:
    """Write something slowly; every start is counted.

    Args:
        name: What to write.
    """
    with _db() as db:
        db.execute("INSERT INTO starts VALUES (?, ?)", (name, ctx.idempotency_key))
    _hold(f"write-{name}")
    with _db() as db:
        db.execute("INSERT INTO done VALUES (?, ?)", (ctx.idempotency_key, name))
    return f"wrote {name}"


TOOLS = (
    make_tool(slow_read, effect="read", timeout=30),
    make_tool(slow_write, effect="write", timeout=30, reconcile=_reconcile),
)
