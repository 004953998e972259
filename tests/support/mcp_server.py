"""A real MCP server for the tests, built with the SDK's MCPServer (FastMCP in mcp 1.x).

    python tests/support/mcp_server.py                  stdio (the client starts it)
    python tests/support/mcp_server.py --http PORTFILE  streamable HTTP on 127.0.0.1, a free port,
                                                written to PORTFILE once it listens

A small notes service. Its reads are annotated `readOnlyHint: true`; `add_note` has no
annotations at all (so it must wait for approval), `delete_note` is destructive. Every start
of a write is counted in SQLite under NOTES_DIR with the idempotency key the client sent in
the request's `_meta`, so a test can prove a write ran exactly once, or never.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import sqlite3
import sys
import time
from datetime import date
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import (
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    ToolAnnotations,
)
from pydantic import BaseModel, Field

IDEMPOTENCY_META = "switchboard/idempotency-key"  # what Switchboard sends (tools/mcp)
READ = ToolAnnotations(readOnlyHint=True)
DESTRUCTIVE = ToolAnnotations(readOnlyHint=False, destructiveHint=True)

server = MCPServer("notes", log_level="WARNING")


class Owner(BaseModel):
    """Who looks after a note."""

    name: str
    email: str = Field(json_schema_extra={"format": "email"})


def _dir() -> Path:
    return Path(os.environ["NOTES_DIR"])


def _db() -> sqlite3.Connection:
    db = sqlite3.connect(_dir() / "notes.sqlite3", timeout=10, isolation_level=None)
    db.execute(
        "CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, title TEXT, body TEXT, "
        "meta TEXT, key TEXT UNIQUE)"
    )
    db.execute("CREATE TABLE IF NOT EXISTS starts (tool TEXT, title TEXT, key TEXT)")
    return db


def _key(ctx: Context) -> str | None:
    meta = ctx.request_context.meta or {}
    value = meta.get(IDEMPOTENCY_META)
    return value if isinstance(value, str) else None


@server.tool(annotations=READ)
def list_notes() -> str:
    """List every note as JSON: id and title."""
    with _db() as db:
        rows = db.execute("SELECT id, title FROM notes ORDER BY id").fetchall()
    return json.dumps([{"id": i, "title": t} for i, t in rows])


@server.tool(annotations=READ)
def get_note(note_id: int) -> str:
    """Show one note."""
    with _db() as db:
        row = db.execute("SELECT title, body FROM notes WHERE id = ?", (note_id,)).fetchone()
    if row is None:
        raise ToolError(f"no note {note_id}")
    return f"{row[0]}: {row[1]}"


@server.tool()
def add_note(
    ctx: Context,
    title: Annotated[str, Field(description="A short title.")],
    body: str = "",
    tags: list[str] | None = None,
    priority: Literal["low", "normal", "high"] = "normal",
    due: date | None = None,
    owner: Owner | None = None,
) -> str:
    """Add a note. Idempotent per idempotency key: a repeated request returns the first note."""
    key = _key(ctx)
    meta: dict[str, Any] = {"tags": tags, "priority": priority, "due": str(due) if due else None}
    meta["owner"] = owner.model_dump() if owner else None
    with _db() as db:
        db.execute("INSERT INTO starts VALUES ('add_note', ?, ?)", (title, key))
        if key is not None:
            row = db.execute("SELECT id FROM notes WHERE key = ?", (key,)).fetchone()
            if row is not None:
                return f"note {row[0]} (already added)"
        cursor = db.execute(
            "INSERT INTO notes (title, body, meta, key) VALUES (?, ?, ?, ?)",
            (title, body, json.dumps(meta), key),
        )
    return f"added note {cursor.lastrowid}"


@server.tool(annotations=DESTRUCTIVE)
def delete_note(ctx: Context, note_id: int) -> str:
    """Delete a note for good."""
    with _db() as db:
        db.execute("INSERT INTO starts VALUES ('delete_note', ?, ?)", (str(note_id), _key(ctx)))
        deleted = db.execute("DELETE FROM notes WHERE id = ?", (note_id,)).rowcount
    if not deleted:
        raise ToolError(f"no note {note_id}")
    return f"deleted note {note_id}"


@server.tool()
async def slow_note(ctx: Context, title: str) -> str:
    """Add a note slowly: waits until the test lets it finish (NOTES_DIR/release)."""
    with _db() as db:
        db.execute("INSERT INTO starts VALUES ('slow_note', ?, ?)", (title, _key(ctx)))
    (_dir() / f"started-{title}").touch()
    deadline = time.monotonic() + 30
    try:
        while not (_dir() / "release").exists() and time.monotonic() < deadline:
            await anyio.sleep(0.01)
    except anyio.get_cancelled_exc_class():  # the client asked to cancel (notifications/cancelled)
        (_dir() / f"cancelled-{title}").touch()
        raise
    with _db() as db:
        db.execute("INSERT INTO notes (title, body, key) VALUES (?, '', ?)", (title, _key(ctx)))
    return f"added {title} slowly"


@server.tool(annotations=READ)
def snapshot() -> CallToolResult:
    """The notes as an image, an embedded file, a link and structured data."""
    pixel = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 2040).decode()
    blob = base64.b64encode(b"x" * 3000).decode()
    return CallToolResult(
        content=[
            TextContent(type="text", text="three notes"),
            ImageContent(type="image", data=pixel, mimeType="image/png"),
            EmbeddedResource(
                type="resource",
                resource=BlobResourceContents(
                    uri="file:///notes.db", blob=blob, mimeType="application/octet-stream"
                ),
            ),
            ResourceLink(type="resource_link", uri="https://notes.example/all", name="all notes"),
        ],
        structuredContent={"count": 3},
    )


@server.tool(annotations=READ)
def stats() -> CallToolResult:
    """Only structured content, no text."""
    return CallToolResult(content=[], structuredContent={"notes": 3, "oldest": "2026-01-02"})


def serve_http(port_file: Path) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    app = server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    http = uvicorn.Server(config)

    async def main() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(http.serve, [sock])
            while not http.started:
                await anyio.sleep(0.01)
            port_file.write_text(str(sock.getsockname()[1]))

    anyio.run(main)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        serve_http(Path(sys.argv[2]))
    else:
        server.run("stdio")
