"""Errors raised by the tool library.

Three families, as in pydantic-ai: errors the *model* reads (`ArgumentError`, and
`ToolError`, which a tool raises on purpose), errors an *operator or developer* must fix
at start-up (`OperatorError` and its subclasses; other packages add theirs), and
everything else a tool raises while running, which `execute` turns into an error
observation with the exception's type and a logged traceback.

    Exception
    ├── ArgumentError (ValueError)          the model reads it
    ├── ToolError                           the model reads it as written; no traceback logged
    │   └── NotConnected                    the person must connect (NeedsMoreAccess: again)
    └── OperatorError                       the command line prints it, one line, exit 2
        ├── ToolDefinitionError
        │   └── DuplicateToolError
        ├── ToolModuleError
        ├── PolicyError
        ├── McpConfigError                  the SWITCHBOARD_MCP file is invalid
        └── McpServerError                  an MCP server cannot be reached or listed
"""

from __future__ import annotations

MAX_MESSAGE_CHARS = 1000


def bounded(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """Cut `text` to at most `limit` characters, marking the cut with an ellipsis."""
    if len(text) <= limit:
        return text
    return text[: max(limit - 1, 0)] + "…"


def brief(exc: BaseException, limit: int = 300) -> str:
    """An error in one bounded line, as logs and a failed run's detail give it: its type and
    message, the first `limit` characters."""
    return f"{type(exc).__name__}: {exc}"[:limit]


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


class ToolError(Exception):
    """Raised by a tool to tell the model why its call failed, in words meant for the model.

    The message becomes the observation as written (capped like any output) and is logged
    without a traceback: it is an expected failure ("no order 42"), not a bug. Anything else
    a tool raises is reported as `Error: <type>: <message>` and logged with its traceback.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)

    @property
    def message(self) -> str:
        return str(self.args[0])


class NotConnected(ToolError):
    """The person asking has not connected their account for a per-user tool (or their
    connection was revoked or expired). The call gets no credentials: the message tells the
    model the person must connect, and the surface offers them a Connect button."""

    def __init__(self, provider: str, label: str = "", why: str = "") -> None:
        self.provider = provider
        self.label = label or provider
        reason = f" ({why})" if why else ""
        super().__init__(
            f"Not run: the person asking has not connected their {self.label} account"
            f"{reason}, and this tool acts as them. They have been offered a Connect button; "
            "tell them to connect, then ask again. Do not try another way around it."
        )


class NeedsMoreAccess(NotConnected):
    """The person's connection works, but the service refused this call for want of access it
    does not give (an MCP server's HTTP 403 `insufficient_scope`, RFC 6750): nothing ran.
    `scopes` are what the service asked for, as far as it said (`scope_tokens`); the person
    is offered to connect again asking for them too (the "step-up" of the MCP
    authorization spec), and keeps the access they had meanwhile. Made by `short_of_access`,
    which makes a plain tool error of a refusal that names no scope."""

    def __init__(self, provider: str, label: str = "", scope: str = "") -> None:
        self.provider = provider
        self.label = label or provider
        self.scopes = scope_tokens(scope)
        wanted = bounded(" ".join(self.scopes), 300)
        ToolError.__init__(
            self,
            f"Not run: the person asking has connected their {self.label} account, but it "
            f"does not give the access this call needs ({wanted}). They have been offered to "
            "connect again with more access; tell them to, then ask again. Do not try another "
            "way around it.",
        )


def short_of_access(provider: str, label: str, scope: str) -> ToolError:
    """A call refused for want of access: NeedsMoreAccess when the service named the scopes
    it needs, else a plain tool error (connecting again would ask for what the person has)."""
    needs = NeedsMoreAccess(provider, label, scope)
    if needs.scopes:
        return needs
    return ToolError(
        f"Not run: the person asking has connected their {needs.label} account, but the "
        "service refused this call for want of access it did not name, so connecting again "
        "would not help. Tell them; whoever runs the service decides what the connection may "
        "do. Do not try another way around it."
    )


MAX_SCOPES = 50  # scope tokens a service may ask for at once
MAX_SCOPE_CHARS = 200  # of each


def scope_tokens(text: str) -> tuple[str, ...]:
    """The OAuth scope tokens of a space-separated `scope` (RFC 6749 3.3: printable ASCII but
    space, double quote and backslash), in order, once each; anything else is left out, and
    so is what passes MAX_SCOPES tokens of MAX_SCOPE_CHARS characters."""
    found: list[str] = []
    for token in text[: MAX_SCOPES * (MAX_SCOPE_CHARS + 1)].split(" "):
        if (
            token
            and len(token) <= MAX_SCOPE_CHARS
            and all("!" <= ch <= "~" and ch not in '"\\' for ch in token)
            and token not in found
        ):
            found.append(token)
            if len(found) == MAX_SCOPES:
                break
    return tuple(found)


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


class McpConfigError(OperatorError, ValueError):
    """The MCP servers file (SWITCHBOARD_MCP) is invalid; the message names the line."""


class McpServerError(OperatorError):
    """An MCP server could not be started, reached or listed, or its tools cannot be
    registered as configured; the message names the server and what to check."""
