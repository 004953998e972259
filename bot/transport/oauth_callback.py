"""`GET /oauth/callback`: where a provider sends the person's browser back after they
connected (or refused). The page says what happened in words for them: the finishing code
to enter in Slack, or why nothing was connected. Nothing the query carries is trusted:
every check is worker/service/connections.py's `complete`, and the page escapes all it
shows. Pages are never cached, and refer nowhere (the code must not leak in a Referer).
The console's own callback (switchboard/local_callback.py) answers with these pages too."""

from __future__ import annotations

import html
from urllib.parse import parse_qs

from worker.runtime import Runtime
from worker.service import connections

CALLBACK_PATH = connections.CALLBACK_PATH
MAX_QUERY_CHARS = 8_000
HEADERS = {
    "Content-Type": "text/html; charset=utf-8",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
    "X-Frame-Options": "DENY",
}

FINISH = (
    "<h1>Almost connected</h1><p>Go back to Slack, press <b>Enter code</b> on the message "
    "from Switchboard, and enter this code (it works for {minutes} minutes, once, and only "
    "for the person who pressed Connect):</p><p id=code><code>{code}</code></p>"
)
REFUSED = "<h1>Not connected</h1><p id=why>{why}</p>"
CONNECTED = (
    "<h1>Connected</h1><p id=connected>Your {label} account is connected. Close this page "
    "and go back to the terminal.</p>"
)
TOO_LONG = "This link is too long to be a connection."


def callback_page(rt: Runtime, query_string: str) -> tuple[int, str]:
    """The status and HTML of the page for this callback."""
    query = read_query(query_string)
    if query is None:
        return 400, refused_page(TOO_LONG)
    try:
        finished = connections.complete(
            rt,
            query.get("state", ""),
            code=query.get("code", ""),
            error=query.get("error", ""),
            description=query.get("error_description", ""),
        )
    except connections.ConnectRefused as refused:
        return 400, refused_page(str(refused))
    body = FINISH.format(code=html.escape(finished.code), minutes=finished.seconds // 60)
    return 200, page(body)


def read_query(query_string: str) -> dict[str, str] | None:
    """The callback's parameters (the first of each); None past MAX_QUERY_CHARS."""
    if len(query_string) > MAX_QUERY_CHARS:
        return None
    return {k: v[0] for k, v in parse_qs(query_string, keep_blank_values=True).items()}


def refused_page(why: str) -> str:
    return page(REFUSED.format(why=html.escape(why)))


def connected_page(label: str) -> str:
    return page(CONNECTED.format(label=html.escape(label)))


def page(body: str) -> str:
    return (
        "<!doctype html><html><head><meta charset=utf-8><title>Switchboard</title>"
        '<meta name=viewport content="width=device-width">'
        "<style>body{font-family:sans-serif;max-width:36em;margin:3em auto}"
        "code{font-size:2em;letter-spacing:.1em}</style></head>"
        f"<body>{body}</body></html>"
    )
