"""An MCP tool result as the text the model reads.

Text content is kept as it is. Everything else becomes a short, bounded line: an image or
audio clip is named with its type and size (its bytes would only cost tokens), an embedded
resource shows its text or names its binary content, a resource link shows where it points.
Structured content is shown as JSON when the server sent no text (servers are asked to send
both, the text being the JSON); `isError` results become a `ToolError`, so the model reads
the server's words as the failed call's observation. `execute` then caps the whole text at
the tool's output cap, as for any tool.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from mcp import types

from tools.exceptions import ToolError, bounded

MAX_RESULT_CHARS = 200_000  # read no further than this; the output cap is far below it
MAX_LABEL_CHARS = 200


def result_text(result: types.CallToolResult, tool_name: str) -> str:
    """The observation for a result; raises ToolError for an `isError` result."""
    parts = [_block(block) for block in result.content]
    texts = [part for part in parts if part]
    structured = result.structured_content
    has_text = any(isinstance(block, types.TextContent) for block in result.content)
    if structured is not None and not has_text:
        texts.insert(0, _json(structured))
    text = "\n".join(texts)[:MAX_RESULT_CHARS]
    if result.is_error:
        detail = text.strip() or f"{tool_name} failed; the server gave no details"
        raise ToolError(detail if detail.lower().startswith("error") else f"Error: {detail}")
    return text if text.strip() else "(the tool returned no content)"


def _block(block: Any) -> str:
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ImageContent):
        return f"[image: {_label(block.mime_type)}, {_size(block.data)}]"
    if isinstance(block, types.AudioContent):
        return f"[audio: {_label(block.mime_type)}, {_size(block.data)}]"
    if isinstance(block, types.ResourceLink):
        return f"[resource link: {_label(block.name)} <{_label(str(block.uri))}>]"
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource
        uri = _label(str(resource.uri))
        if isinstance(resource, types.TextResourceContents):
            return f"[resource <{uri}>]\n{resource.text}"
        kind = _label(resource.mime_type or "binary data")
        return f"[resource <{uri}>: {kind}, {_size(resource.blob)}]"
    kind = getattr(block, "type", type(block).__name__)
    return f"[{_label(str(kind))} content]"


def _size(data: str) -> str:
    """The decoded size of base64 data, without decoding megabytes to learn it."""
    try:
        head = base64.b64decode(data[:4], validate=True) if data else b""
    except (binascii.Error, ValueError):
        head = None
    if head is None:
        return "not valid base64"
    size = len(data) * 3 // 4 - data[-2:].count("=")
    return f"{size / 1024:.1f} KB" if size >= 1024 else f"{size} bytes"


def _label(text: str | None) -> str:
    return bounded(" ".join(str(text or "unknown").split()), MAX_LABEL_CHARS)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
