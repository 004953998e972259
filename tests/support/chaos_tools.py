"""Tools for the chaos soak (bench/chaos_soak.py), loaded by its workers through
SWITCHBOARD_TOOLS. Importing this module registers nothing (see `TOOLS`).

Each tool keeps its own record in a SQLite file under CHAOS_DIR, apart from Redis, so the
soak can check what really ran against what Switchboard says: every start of a read (to
bound its retries) and every start and finish of a write, with its idempotency key (the
approval's id) and the wall-clock time it started.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from tools import ToolContext
from tools.declare import make_tool

WRITE_SECONDS = 0.2  # long enough that a kill sometimes lands in the middle of one


def _db(folder: Path | None = None) -> sqlite3.Connection:
    path = (folder or Path(os.environ["CHAOS_DIR"])) / "effects.sqlite3"
    db = sqlite3.connect(path, timeout=30, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE IF NOT EXISTS reads (run TEXT, call TEXT, topic TEXT, at REAL)")
    db.execute("CREATE TABLE IF NOT EXISTS starts (key TEXT, run TEXT, name TEXT, at REAL)")
    db.execute("CREATE TABLE IF NOT EXISTS done (key TEXT PRIMARY KEY, name TEXT)")
    return db


def chaos_lookup(ctx: ToolContext, topic: str) -> str:
    """Look a topic up.

    Args:
        topic: What to look up.
    """
    with _db() as db:
        db.execute(
            "INSERT INTO reads VALUES (?, ?, ?, ?)", (ctx.run_id, ctx.call_id, topic, time.time())
        )
    return f"facts about {topic}"


def chaos_record(ctx: ToolContext, name: str) -> str:
    """Record something; every start is counted.

    Args:
        name: What to record.
    """
    with _db() as db:
        db.execute(
            "INSERT INTO starts VALUES (?, ?, ?, ?)",
            (ctx.idempotency_key, ctx.run_id, name, time.time()),
        )
    time.sleep(WRITE_SECONDS)
    with _db() as db:
        db.execute("INSERT INTO done VALUES (?, ?)", (ctx.idempotency_key, name))
    return f"recorded {name}"


def _reconcile(ctx: ToolContext, args: dict[str, Any]) -> str | None:
    """After a crash mid-call: did that write finish? (its own record says)"""
    with _db() as db:
        row = db.execute("SELECT name FROM done WHERE key = ?", (ctx.idempotency_key,)).fetchone()
    return f"recorded {row[0]}" if row else None


def reads(folder: Path) -> list[tuple[str, str, str, float]]:
    with _db(folder) as db:
        return list(db.execute("SELECT run, call, topic, at FROM reads"))


def starts(folder: Path) -> list[tuple[str, str, str, float]]:
    with _db(folder) as db:
        return list(db.execute("SELECT key, run, name, at FROM starts"))


def finished(folder: Path) -> set[str]:
    with _db(folder) as db:
        return {row[0] for row in db.execute("SELECT key FROM done")}


TOOLS = (
    make_tool(chaos_lookup, effect="read", timeout=10),
    make_tool(chaos_record, effect="write", timeout=10, reconcile=_reconcile),
)
