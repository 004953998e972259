"""Errors raised by the tool library.

Three families, as in pydantic-ai: errors the *model* reads (`ArgumentError`),
errors an *operator or developer* must fix at start-up (`OperatorError` and its
subclasses `ToolDefinitionError`, `DuplicateToolError`, `ToolModuleError`,
`PolicyError`; other packages add theirs), and everything a tool raises while
running, which `execute` turns into an error observation.

    Exception
    ├── ArgumentError (ValueError)          the model reads it
    └── OperatorError                       the command line prints it, one line, exit 2
        ├── ToolDefinitionError
        │   └── DuplicateToolError
        ├── ToolModuleError
        └── PolicyError
"""

from __future__ import annotations

MAX_MESSAGE_CHARS = 1000


def bounded(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """Cut `text` to at most `limit` characters, marking the cut with an ellipsis."""
    if len(text) <= limit:
        return text
    return text[: max(limit - 1, 0)] + "…"


class ArgumentError(ValueError):
    """The model's arguments for a tool call are unusable.

    The message is meant for the model: it says what was wrong and what was
    expected, and it is never longer than 1,000 characters.
    """

    def __init__(self, message: str) -> None:
        super().__init__(bounded(message))

    @property
    def message(self) -> str:
        return str(self.args[0])


class OperatorError(Exception):
    """A configuration problem the operator can fix. The message says what is wrong, where,
    and how to fix it; the command line prints it without a traceback."""


class ToolDefinitionError(OperatorError, ValueError):
    """A tool declaration is invalid (bad name, schema, signature, effect...)."""


class DuplicateToolError(ToolDefinitionError):
    """A tool with this name is already registered."""


class ToolModuleError(OperatorError, ImportError):
    """A module named in SWITCHBOARD_TOOLS could not be imported."""


class PolicyError(OperatorError, ValueError):
    """The permission policy file is invalid; the message says where and what to fix."""
