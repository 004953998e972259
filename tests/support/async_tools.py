"""A tool whose handler is a coroutine, for worker processes (SWITCHBOARD_TOOLS; listed in
`TOOLS`, so importing this module registers nothing): a slot's synchronous code runs it to its
end (tools/mcp/loop.py `run_to_end`), beside the MCP servers' own event loop."""

from __future__ import annotations

import asyncio

from tools.declare import make_tool


async def echo_later(text: str) -> str:
    """Say the text back after a pause.

    Args:
        text: What to say back.
    """
    await asyncio.sleep(0.05)
    return f"echo: {text}"


TOOLS = (make_tool(echo_later, effect="read"),)
