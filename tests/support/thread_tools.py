"""A tool that says what its thread-locals are kept by, for worker processes
(SWITCHBOARD_TOOLS; listed in `TOOLS`, so importing this module registers nothing)."""

from __future__ import annotations

import threading

from tools import threads
from tools.declare import make_tool


def where_am_i() -> str:
    """Say what keeps this worker's spare threads apart: its OS threads or its greenlets."""
    # threading.local as the process has it now (gevent's local in a patched process)
    kept = "greenlet" if isinstance(threads._kept, threading.local) else "OS thread"
    return f"spares kept per {kept}"


TOOLS = (make_tool(where_am_i, effect="read"),)
