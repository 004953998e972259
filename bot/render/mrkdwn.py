"""Text for Slack's mrkdwn: escaping, cutting to size, splitting, and Markdown conversion.

Anything the model, a tool or a person wrote is escaped before it lands in a block, so it
cannot ping `<!channel>`/`<!here>`, mention people or forge links; only the bot adds those.
A Markdown link becomes a Slack link only when its label does not name another address
than it opens, and values shown as code (tool arguments) have their bidirectional control
characters written out (`\u202e`), so what an approver reads is what runs.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any
from urllib.parse import urlsplit

from bot.transport import ids

_LINK = re.compile(r"\[([^\[\]\n|]{1,300})\]\((https?://[^\s()<>|]{1,1500})\)")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*")
_UNDERLINE_BOLD = re.compile(r"__(?=\S)(.+?)(?<=\S)__")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*$", re.MULTILINE)
_FENCE = "```"
# Unicode's bidirectional controls: embeddings, overrides, isolates, LRM/RLM and ALM. They
# reorder how text is displayed ("Trojan Source"), so a value can read unlike what it is.
BIDI_CONTROLS = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
_BIDI = re.compile(f"[{BIDI_CONTROLS}]")
# what a reader takes for an address in a link's label: a scheme, or a dotted host name
_ADDRESS = re.compile(
    r"(?:[^\W_][\w+.-]*://)?"  # scheme
    r"(?:(?:[\w-]+\.)+[^\W\d_]{2,63}|[0-9]{1,3}(?:\.[0-9]{1,3}){3})"  # host name or IPv4
    r"(?::[0-9]{1,5})?"  # port
    r"(?:[/?#][^\s]*)?"  # path, query, fragment
)


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
    """Inline code, bidi controls written out: backticks inside would end it early."""
    return "`" + escape(neutralise_bidi(text.replace("`", "'"))) + "`"


def code_block(text: str) -> str:
    """A preformatted block, bidi controls written out; a fence inside would end it early."""
    return _FENCE + escape(neutralise_bidi(text).replace(_FENCE, "`\u200b``")) + _FENCE


def neutralise_bidi(text: str) -> str:
    """Every bidirectional control character written out as its JSON escape (`\u202e`):
    shown raw, it would reorder the text around it on the reader's screen."""
    return _BIDI.sub(lambda found: f"\\u{ord(found.group()):04x}", text)


def has_bidi(text: str) -> bool:
    return _BIDI.search(text) is not None


def pretty_json(value: Any, *, value_limit: int = 300) -> tuple[str, bool]:
    """Indented JSON with long strings cut; returns (text, whether anything was cut)."""
    text, paths = pretty_json_cut(value, value_limit=value_limit)
    return text, bool(paths)


def pretty_json_cut(value: Any, *, value_limit: int = 300) -> tuple[str, list[str]]:
    """Indented JSON with long strings and lists cut; returns (text, where it was cut): the
    paths of the cut values (`body`, `items[20:]`, `a.b`), in the order they appear."""
    paths: list[str] = []

    def shorten(item: Any, path: str) -> Any:
        if isinstance(item, str) and len(item) > value_limit:
            paths.append(path)
            return item[: value_limit - 1] + "…"
        if isinstance(item, dict):
            return {k: shorten(v, f"{path}.{k}" if path else str(k)) for k, v in item.items()}
        if isinstance(item, list):
            if len(item) > 20:
                paths.append(f"{path}[20:]")
                return [shorten(v, f"{path}[{n}]") for n, v in enumerate(item[:20])] + ["…"]
            return [shorten(v, f"{path}[{n}]") for n, v in enumerate(item)]
        return item

    text = json.dumps(shorten(value, ""), indent=2, ensure_ascii=False, default=str)
    return text, paths


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


def safe_links(markdown: str) -> str:
    """Markdown (as streamed to Slack) whose links cannot mislead: a link whose label names
    another address than it opens is written as the bare address it opens."""
    return _LINK.sub(
        lambda m: m.group(2) if misleading(m.group(1), m.group(2)) else m.group(0), markdown
    )


def _link(match: re.Match[str]) -> str:
    """`<url|label>`; just `<url>` (Slack shows the address) when the label names another
    address than the link opens, e.g. [https://bank.example](https://evil.example)."""
    label, url = match.group(1), match.group(2)
    if misleading(_unescape(label), _unescape(url)):
        return f"<{url}>"
    return f"<{url}|{label}>"


def misleading(label: str, url: str) -> bool:
    """Does `label` name an address other than `url`? Another host, or (when the label
    names a path) another path or query. Unreadable addresses count as other."""
    try:
        target = urlsplit(url)
        for found in _ADDRESS.finditer(label):
            text = found.group()
            named = urlsplit(text if "://" in text else "//" + text)
            if _host(named.netloc) != _host(target.netloc):
                return True
            if (named.path.rstrip("/") or named.query or named.fragment) and (
                named.path.rstrip("/"),
                named.query,
                named.fragment,
            ) != (target.path.rstrip("/"), target.query, target.fragment):
                return True
    except ValueError:  # e.g. an unclosed "[" in a host
        return True
    return False


def _host(netloc: str) -> str:
    return netloc.rsplit("@", 1)[-1].lower().rstrip(".")


def _unescape(text: str) -> str:
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


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
