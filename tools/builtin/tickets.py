"""A small SQLite ticket tracker: `search_tickets` (read) and three write tools.

Writes are idempotent on `ctx.idempotency_key`, Stripe style: the key, the
tool, a hash of the request and the stored result are written in the same
transaction as the effect, so a retried call returns the first result and
never repeats the effect. Every real effect is also recorded in an
`executions` table, which lets tests prove a write ran exactly once.

Why ~500 lines in one module: it is the sample an operator copies to write a stateful,
idempotent tool, so the store, its idempotency and the tools that use them read together,
top to bottom.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from tools.context import ToolContext
from tools.declare import make_tool
from tools.decode import canonical_json

MAX_TITLE_CHARS = 200
MAX_BODY_CHARS = 10_000
MAX_RESOLUTION_CHARS = 2_000
MAX_LIMIT = 50
EXCERPT_CHARS = 200

Priority = Literal["low", "normal", "high", "urgent"]
Project = Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$")]
Title = Annotated[str, Field(min_length=1, max_length=MAX_TITLE_CHARS)]
Body = Annotated[str, Field(max_length=MAX_BODY_CHARS)]
TicketId = Annotated[int, Field(ge=1)]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tickets (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    project TEXT NOT NULL,
    title TEXT NOT NULL,
    body TEXT NOT NULL DEFAULT '',
    priority TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('open', 'closed')),
    resolution TEXT,
    created_by TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    closed_at TEXT
);
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key TEXT PRIMARY KEY,
    tool TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    result TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS executions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tool TEXT NOT NULL,
    idempotency_key TEXT,
    at TEXT NOT NULL
);
"""
_COLUMNS = (
    "id, project, title, body, priority, status, resolution, "
    "created_by, created_at, updated_at, closed_at"
)


class TicketError(ValueError):
    """A ticket operation cannot be done (no such ticket, already closed...)."""


class IdempotencyConflict(TicketError):
    """An idempotency key was reused for a different request."""


def db_path(settings: Mapping[str, str]) -> Path:
    """The `tickets_db` setting (SWITCHBOARD_TICKETS_DB), else the default."""
    configured = settings.get("tickets_db", "")
    return Path(configured).expanduser() if configured else default_db_path()


def default_db_path() -> Path:
    """$XDG_DATA_HOME (or ~/.local/share)/switchboard/tickets.sqlite3."""
    data_home = os.environ.get("XDG_DATA_HOME", "").strip()
    base = Path(data_home) if data_home else Path.home() / ".local" / "share"
    return base / "switchboard" / "tickets.sqlite3"


def request_hash(tool: str, user_id: str, args: dict[str, Any]) -> str:
    """What an idempotency key is bound to: the tool, the requester and the arguments."""
    request = {"tool": tool, "user": user_id, "args": args}
    return hashlib.sha256(canonical_json(request).encode()).hexdigest()


class TicketStore:
    """The ticket database at `path`. Opens a connection per operation (thread-safe)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_db_path()
        self._ready = False

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        """A connection in autocommit mode; transactions are explicit (BEGIN IMMEDIATE)."""
        if not self._ready:
            self._create_schema()
        connection = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
        connection.row_factory = sqlite3.Row
        try:
            yield connection
        finally:
            connection.close()

    # -- reads ----------------------------------------------------------------

    def get(self, ticket_id: int) -> dict[str, Any] | None:
        with self.connect() as db:
            row = db.execute(
                f"SELECT {_COLUMNS} FROM tickets WHERE id = ?", (ticket_id,)
            ).fetchone()
        return dict(row) if row else None

    def search(
        self,
        query: str = "",
        status: str = "open",
        project: str | None = None,
        limit: int = 10,
    ) -> dict[str, Any]:
        """Tickets matching `query` in title or body, newest first, with the total count."""
        where, params = ["1 = 1"], []
        if query.strip():
            pattern = "%" + _escape_like(query.strip()) + "%"
            where.append("(title LIKE ? ESCAPE '\\' OR body LIKE ? ESCAPE '\\')")
            params += [pattern, pattern]
        if status != "any":
            where.append("status = ?")
            params.append(status)
        if project:
            where.append("project = ? COLLATE NOCASE")
            params.append(project.strip())
        clause = " AND ".join(where)
        with self.connect() as db:
            total = db.execute(f"SELECT COUNT(*) FROM tickets WHERE {clause}", params).fetchone()[0]
            rows = db.execute(
                f"SELECT {_COLUMNS} FROM tickets WHERE {clause} ORDER BY id DESC LIMIT ?",
                [*params, max(1, min(limit, MAX_LIMIT))],
            ).fetchall()
        tickets = [_summary(dict(row)) for row in rows]
        return {"tickets": tickets, "count": len(tickets), "total": total}

    def count_executions(self, tool: str | None = None) -> int:
        """How many real effects ran (for one tool, or all)."""
        with self.connect() as db:
            if tool is None:
                row = db.execute("SELECT COUNT(*) FROM executions").fetchone()
            else:
                row = db.execute(
                    "SELECT COUNT(*) FROM executions WHERE tool = ?", (tool,)
                ).fetchone()
        return int(row[0])

    def stored_result(self, key: str, tool: str, digest: str) -> Any | None:
        """The result stored for an idempotency key, or None if that key never ran."""
        with self.connect() as db:
            row = db.execute(
                "SELECT tool, request_hash, result FROM idempotency_keys WHERE key = ?", (key,)
            ).fetchone()
        if row is None:
            return None
        _check_same_request(row, key, tool, digest)
        return json.loads(row["result"])

    # -- writes ---------------------------------------------------------------

    def create(
        self,
        *,
        project: str,
        title: str,
        body: str,
        priority: str,
        created_by: str,
        key: str | None = None,
    ) -> dict[str, Any]:
        args = {"project": project, "title": title, "body": body, "priority": priority}

        def effect(db: sqlite3.Connection, now: str) -> dict[str, Any]:
            cursor = db.execute(
                "INSERT INTO tickets (project, title, body, priority, status, created_by, "
                "created_at, updated_at) VALUES (?, ?, ?, ?, 'open', ?, ?, ?)",
                (
                    project.strip(),
                    _text(title, "title"),
                    body.strip(),
                    priority,
                    created_by,
                    now,
                    now,
                ),
            )
            return _fetch(db, int(cursor.lastrowid or 0))

        return self.run_once("create_ticket", created_by, args, key, effect)

    def update(
        self,
        ticket_id: int,
        changes: dict[str, str | None],
        *,
        updated_by: str,
        key: str | None = None,
    ) -> dict[str, Any]:
        fields = {name: value for name, value in changes.items() if value is not None}
        if not fields:
            raise TicketError("nothing to update: give a new title, body or priority")
        if "title" in fields:
            fields["title"] = _text(fields["title"], "title")

        def effect(db: sqlite3.Connection, now: str) -> dict[str, Any]:
            _open_ticket(db, ticket_id)
            assignments = ", ".join(f"{name} = ?" for name in fields)
            db.execute(
                f"UPDATE tickets SET {assignments}, updated_at = ? WHERE id = ?",
                [*fields.values(), now, ticket_id],
            )
            return _fetch(db, ticket_id)

        args = {"ticket_id": ticket_id, **changes}
        return self.run_once("update_ticket", updated_by, args, key, effect)

    def close(
        self, ticket_id: int, resolution: str, *, closed_by: str, key: str | None = None
    ) -> dict[str, Any]:
        def effect(db: sqlite3.Connection, now: str) -> dict[str, Any]:
            _open_ticket(db, ticket_id)
            db.execute(
                "UPDATE tickets SET status = 'closed', resolution = ?, updated_at = ?, "
                "closed_at = ? WHERE id = ?",
                (_text(resolution, "resolution"), now, now, ticket_id),
            )
            return _fetch(db, ticket_id)

        args = {"ticket_id": ticket_id, "resolution": resolution}
        return self.run_once("close_ticket", closed_by, args, key, effect)

    def run_once(
        self,
        tool: str,
        user_id: str,
        args: dict[str, Any],
        key: str | None,
        effect: Callable[[sqlite3.Connection, str], dict[str, Any]],
    ) -> dict[str, Any]:
        """Apply `effect` at most once per idempotency key, in one transaction.

        A key seen before returns its stored result (same request) or raises
        IdempotencyConflict (different request). Without a key the effect
        simply runs.
        """
        digest = request_hash(tool, user_id, args)
        now = _now()
        with self.connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                if key is not None:
                    row = db.execute(
                        "SELECT tool, request_hash, result FROM idempotency_keys WHERE key = ?",
                        (key,),
                    ).fetchone()
                    if row is not None:
                        _check_same_request(row, key, tool, digest)
                        db.execute("ROLLBACK")
                        stored: dict[str, Any] = json.loads(row["result"])
                        return stored
                stored_text = canonical_json(effect(db, now))
                db.execute(
                    "INSERT INTO executions (tool, idempotency_key, at) VALUES (?, ?, ?)",
                    (tool, key, now),
                )
                if key is not None:
                    db.execute(
                        "INSERT INTO idempotency_keys (key, tool, request_hash, result, created_at)"
                        " VALUES (?, ?, ?, ?, ?)",
                        (key, tool, digest, stored_text, now),
                    )
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        result: dict[str, Any] = json.loads(stored_text)  # first run and replays look alike
        return result

    def _create_schema(self) -> None:
        """Switch the file to WAL and create the tables, once per file per process."""
        with _schema_lock:
            if _file_identity(self.path) in _schema_ready:
                self._ready = True
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
            try:
                _enable_wal(connection)
                connection.execute("BEGIN IMMEDIATE")
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        connection.execute(statement)
                connection.execute("COMMIT")
            finally:
                connection.close()
            _schema_ready.add(_file_identity(self.path))
        self._ready = True


_schema_lock = threading.Lock()
_schema_ready: set[tuple[str, int]] = set()


def _file_identity(path: Path) -> tuple[str, int]:
    """Path and inode: a deleted and re-created file needs its schema again."""
    try:
        return (str(path.resolve()), path.stat().st_ino)
    except FileNotFoundError:
        return (str(path), -1)


def _enable_wal(connection: sqlite3.Connection) -> None:
    """PRAGMA journal_mode=WAL, retried: the switch fails fast while another process
    (another worker creating the same file) holds a lock, without SQLite's busy wait."""
    deadline = time.monotonic() + 10.0
    while True:
        try:
            connection.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


# -- the tools ------------------------------------------------------------------


def search_tickets(
    ctx: ToolContext,
    query: Annotated[str, Field(max_length=200)] = "",
    status: Literal["open", "closed", "any"] = "open",
    project: Project | None = None,
    limit: Annotated[int, Field(ge=1, le=MAX_LIMIT)] = 10,
) -> dict[str, Any]:
    """Search tickets by words in their title or body, newest first.

    Args:
        query: Words to look for; empty lists every ticket with the given status.
        status: Which tickets to include: "open", "closed" or "any".
        project: Only tickets of this project key, e.g. "IT".
        limit: How many tickets to return at most (1-50).
    """
    return TicketStore(db_path(ctx.settings)).search(query, status, project, limit)


def create_ticket(
    ctx: ToolContext,
    project: Project,
    title: Title,
    body: Body = "",
    priority: Priority = "normal",
) -> dict[str, Any]:
    """Open a new ticket in a project's tracker.

    Args:
        project: The project key, e.g. "IT" or "HR".
        title: A one-line summary of the problem or request.
        body: Details, steps to reproduce, links.
        priority: How urgent it is: "low", "normal", "high" or "urgent".
    """
    return TicketStore(db_path(ctx.settings)).create(
        project=project,
        title=title,
        body=body,
        priority=priority,
        created_by=ctx.user_id,
        key=ctx.idempotency_key,
    )


def update_ticket(
    ctx: ToolContext,
    ticket_id: TicketId,
    title: Title | None = None,
    body: Body | None = None,
    priority: Priority | None = None,
) -> dict[str, Any]:
    """Change the title, body or priority of an open ticket.

    Args:
        ticket_id: The ticket number, e.g. 42.
        title: A new one-line summary.
        body: New details (replaces the old body).
        priority: A new priority: "low", "normal", "high" or "urgent".
    """
    changes = {"title": title, "body": body, "priority": priority}
    store = TicketStore(db_path(ctx.settings))
    return store.update(ticket_id, changes, updated_by=ctx.user_id, key=ctx.idempotency_key)


def close_ticket(
    ctx: ToolContext,
    ticket_id: TicketId,
    resolution: Annotated[str, Field(min_length=1, max_length=MAX_RESOLUTION_CHARS)],
) -> dict[str, Any]:
    """Close an open ticket with a resolution note.

    Args:
        ticket_id: The ticket number, e.g. 42.
        resolution: What was done, e.g. "Reset the VPN token".
    """
    return TicketStore(db_path(ctx.settings)).close(
        ticket_id, resolution, closed_by=ctx.user_id, key=ctx.idempotency_key
    )


# -- reconcile hooks: "did this key already run? then here is its result" -----


def reconcile_create(ctx: ToolContext, args: dict[str, Any]) -> Any | None:
    request = {"body": "", "priority": "normal", **args}
    keys = ("project", "title", "body", "priority")
    return _reconcile(ctx, "create_ticket", {k: request.get(k) for k in keys})


def reconcile_update(ctx: ToolContext, args: dict[str, Any]) -> Any | None:
    keys = ("ticket_id", "title", "body", "priority")
    return _reconcile(ctx, "update_ticket", {k: args.get(k) for k in keys})


def reconcile_close(ctx: ToolContext, args: dict[str, Any]) -> Any | None:
    keys = ("ticket_id", "resolution")
    return _reconcile(ctx, "close_ticket", {k: args.get(k) for k in keys})


def _reconcile(ctx: ToolContext, tool: str, args: dict[str, Any]) -> Any | None:
    if ctx.idempotency_key is None:
        return None
    digest = request_hash(tool, ctx.user_id, args)
    return TicketStore(db_path(ctx.settings)).stored_result(ctx.idempotency_key, tool, digest)


# -- helpers --------------------------------------------------------------------


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _text(value: str, what: str) -> str:
    stripped = value.strip()
    if not stripped:
        raise TicketError(f"{what} must not be blank")
    return stripped


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _fetch(db: sqlite3.Connection, ticket_id: int) -> dict[str, Any]:
    row = db.execute(f"SELECT {_COLUMNS} FROM tickets WHERE id = ?", (ticket_id,)).fetchone()
    if row is None:
        raise TicketError(f"ticket #{ticket_id} does not exist")
    return dict(row)


def _open_ticket(db: sqlite3.Connection, ticket_id: int) -> None:
    ticket = _fetch(db, ticket_id)
    if ticket["status"] != "open":
        raise TicketError(f"ticket #{ticket_id} is already closed")


def _summary(ticket: dict[str, Any]) -> dict[str, Any]:
    body = ticket["body"]
    if len(body) > EXCERPT_CHARS:
        ticket["body"] = body[: EXCERPT_CHARS - 1] + "…"
    return ticket


def _check_same_request(row: sqlite3.Row, key: str, tool: str, digest: str) -> None:
    if row["tool"] != tool or row["request_hash"] != digest:
        raise IdempotencyConflict(
            f"idempotency key {key[:64]!r} was already used for a different "
            f"{row['tool']} request; a changed request needs a new approval"
        )


TOOLS = (
    make_tool(search_tickets, effect="read", timeout=10.0),
    make_tool(create_ticket, effect="write", timeout=10.0, reconcile=reconcile_create),
    make_tool(update_ticket, effect="write", timeout=10.0, reconcile=reconcile_update),
    make_tool(close_ticket, effect="write", timeout=10.0, reconcile=reconcile_close),
)
