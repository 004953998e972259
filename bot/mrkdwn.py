"""Text for Slack's mrkdwn: escaping, cutting to size, splitting, and Markdown conversion.

Anything the model, a tool or a person wrote is escaped before it lands in a block, so it
cannot ping `<!channel>`/`<!here>`, mention people or forge links; only the bot adds those.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from bot import ids

_LINK = re.compile(r"\[([^\[\]\n|]{1,300})\]\((https?://[^\s()<>|]{1,1500})\)")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*")
_UNDERLINE_BOLD = re.compile(r"__(?=\S)(.+?)(?<=\S)__")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*$", re.MULTILINE)
_FENCE = "```"


def escape(text: str) -> str:
    """Slack's three control characters; the rest is shown as written."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def plain(text: str, limit: int) -> str:
    """For plain_text fields (button labels, titles): no escaping, just cut."""
    return cut(text, limit)


def cut(text: str, limit: int) -> str:
    """At most `limit` characters, ending with an ellipsis when cut; never splits an entity."""
    if len(text) <= limit:
        return text
    end = _entity_safe(text, max(0, limit - 1))
    return text[:end] + "…"


def _entity_safe(text: str, end: int) -> int:
    """Move `end` back so it does not fall inside an escaped entity like `&amp;`."""
    amp = text.rfind("&", max(0, end - 5), end)
    if amp != -1 and ";" not in text[amp:end]:
        return amp
    return end


def one_line(text: str, limit: int) -> str:
    """Whitespace collapsed, escaped and cut: for list lines and previews."""
    return cut(escape(" ".join(text.split())), limit)


def mention(user_id: str) -> str:
    """A user mention, only for ids we got from Slack's signed payloads or our own records."""
    return f"<@{user_id}>" if ids.shaped(ids.USER, user_id) else escape(user_id or "someone")


def channel(channel_id: str) -> str:
    return f"<#{channel_id}>" if ids.shaped(ids.CHANNEL, channel_id) else escape(channel_id or "-")


def date(ts: float, fmt: str = "{date_short_pretty} at {time}") -> str:
    """A date Slack shows in the reader's own time zone (UTC in the fallback)."""
    fallback = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts))
    return f"<!date^{int(ts)}^{fmt}|{fallback}>"


def clock(ts: float) -> str:
    return date(ts, "{time}")


def code(text: str) -> str:
    """Inline code: backticks inside would end it early."""
    return "`" + escape(text.replace("`", "'")) + "`"


def code_block(text: str) -> str:
    """A preformatted block; a fence inside the text would end it early."""
    return _FENCE + escape(text.replace(_FENCE, "`\u200b``")) + _FENCE


def pretty_json(value: Any, *, value_limit: int = 300) -> tuple[str, bool]:
    """Indented JSON with long strings cut; returns (text, whether anything was cut)."""
    was_cut = False

    def shorten(item: Any) -> Any:
        nonlocal was_cut
        if isinstance(item, str) and len(item) > value_limit:
            was_cut = True
            return item[: value_limit - 1] + "…"
        if isinstance(item, dict):
            return {k: shorten(v) for k, v in item.items()}
        if isinstance(item, list):
            if len(item) > 20:
                was_cut = True
                return [shorten(v) for v in item[:20]] + ["…"]
            return [shorten(v) for v in item]
        return item

    text = json.dumps(shorten(value), indent=2, ensure_ascii=False, default=str)
    return text, was_cut


def to_mrkdwn(markdown: str) -> str:
    """Escape model text and convert the common Markdown the model writes into mrkdwn.

    Only http(s) links become Slack links; the rest of the text cannot produce markup that
    pings, mentions or links, because `<`, `>` and `&` are escaped first.
    """
    parts = markdown.split(_FENCE)
    out = []
    for n, part in enumerate(parts):
        if n % 2 == 1:  # inside a code fence: escape only
            out.append(escape(part))
            continue
        text = escape(part)
        text = _HEADING.sub(r"*\1*", text)
        text = _BOLD.sub(r"*\1*", text)
        text = _UNDERLINE_BOLD.sub(r"*\1*", text)
        text = _STRIKE.sub(r"~\1~", text)
        text = _LINK.sub(_link, text)
        out.append(text)
    return _FENCE.join(out)


def _link(match: re.Match[str]) -> str:
    label, url = match.group(1), match.group(2)
    return f"<{url}|{label}>"


def split(text: str, limit: int) -> list[str]:
    """Pieces of at most `limit` characters, cut at paragraph or line ends where possible;
    a code fence open at a cut is closed and reopened so each piece renders on its own."""
    budget = max(limit - 2 * (len(_FENCE) + 1), 8)  # room to close and reopen a fence
    pieces: list[str] = []
    current = ""
    for line in _lines(text, budget):
        candidate = f"{current}\n{line}" if current else line
        if len(candidate) > budget and current:
            pieces.append(current)
            current = line
        else:
            current = candidate
    if current:
        pieces.append(current)
    return _balance_fences(pieces)


def _lines(text: str, width: int) -> list[str]:
    """Lines of the text, long lines cut to `width`: at a space if there is one, else outside
    entities and runs of backticks (a fence cut in two would not be one any more)."""
    lines: list[str] = []
    for line in text.split("\n"):
        while len(line) > width:
            space = line.rfind(" ", width // 2, width)
            end = space if space > 0 else _hard_cut(line, width)
            lines.append(line[:end])
            line = line[end:].lstrip(" ") if space > 0 else line[end:]
        lines.append(line)
    return lines


def _hard_cut(line: str, width: int) -> int:
    end = _entity_safe(line, width)
    while 0 < end < len(line) and line[end - 1] == line[end] == "`":
        end -= 1
    return end if end > 0 else width  # nothing but backticks (or one entity): cut anyway


def _balance_fences(pieces: list[str]) -> list[str]:
    balanced: list[str] = []
    open_fence = False
    for piece in pieces:
        text = (_FENCE + "\n" + piece) if open_fence else piece
        if piece.count(_FENCE) % 2 == 1:
            open_fence = not open_fence
        if open_fence:
            text += "\n" + _FENCE
        balanced.append(text.strip("\n") or ".")
    return balanced


def duration(seconds: float) -> str:
    """3.2 s, 4 min 5 s, 2 h 3 min."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"
