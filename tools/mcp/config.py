"""Reading the MCP servers file (SWITCHBOARD_MCP) into checked server configurations.

    servers:
      git:                                  # a key of your choosing
        command: mcp-server-git             # stdio: a command and its arguments...
        args: ["--repository", "/srv/repo"]
        env: {GIT_AUTHOR_NAME: Switchboard}
        prefix: ""                          # tool name = prefix + the server's name ("git_")
      docs:
        url: https://mcp.example.com/mcp    # ...or streamable HTTP
        headers: {Authorization: "Bearer ${DOCS_TOKEN}"}
        tools: [search, fetch]              # only these (the server's own names)
        effects: {search: read}             # instead of what the annotations say
        timeout: 30                         # seconds per call
      tracker:
        url: https://mcp.tracker.example/mcp
        auth: per_user                      # each call carries the asking person's own token
        label: Tracker                      # the connection's name for people (default: key)
        scopes: [read, write]               # asked for when a person connects
        headers: {Authorization: "Bearer ${TRACKER_LIST_TOKEN}"}  # for listing only

`auth: per_user` (HTTP servers only) makes the server's own OAuth (discovered from `url:`)
the provider `mcp:<key>` of per-user connections: every tool of the server acts as the
person who asked, with their token, and one who has not connected is offered Connect.
`headers:` of such a server are used only to list its tools at start-up (leave them out
for a server that lists openly); a call never carries them, nor any operator credential.
`auth: service` (the default) sends `headers:` with every call.

`${VAR}` in command, args, env, cwd, url and headers is taken from the environment (`$${`
writes a literal `${`); an unset variable is an error, never an empty string. Like the
policy file, the document is composed rather than just loaded, so every problem names its
line, and reading goes on after one so a single run reports them all.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import sys
import sysconfig
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import yaml

from tools.exceptions import McpConfigError
from tools.yaml_nodes import BOOL as _BOOL
from tools.yaml_nodes import NULL as _NULL
from tools.yaml_nodes import STR as _STR
from tools.yaml_nodes import Invalid as _Invalid
from tools.yaml_nodes import NodeReader, compose
from tools.yaml_nodes import is_null as _is_null

Effect = Literal["read", "write"]
Transport = Literal["stdio", "http"]
Auth = Literal["service", "per_user"]

SERVER_KEYS = (
    *("command", "args", "env", "cwd", "url", "headers", "prefix", "tools", "effects"),
    *("timeout", "connect_timeout", "auth", "label", "scopes"),
)
STDIO_ONLY = ("command", "args", "env", "cwd")
HTTP_ONLY = ("url", "headers")
PER_USER_ONLY = ("label", "scopes")
MAX_LABEL = 40
MAX_SCOPES = 50
DEFAULT_TIMEOUT = 30.0  # seconds per call
DEFAULT_CONNECT_TIMEOUT = 20.0  # seconds to start, connect and list at start-up
MAX_SECONDS = 3600.0

KEY_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,40}$")
PREFIX_PATTERN = re.compile(r"^[A-Za-z0-9_-]{0,40}$")
_VARIABLE = re.compile(r"\$(\$?)\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SCOPE = re.compile(r"^[\x21\x23-\x5b\x5d-\x7e]{1,100}$")  # RFC 6749's scope-token
_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"

Node = yaml.Node


@dataclass(frozen=True)
class ServerConfig:
    """One entry under `servers:`, checked and with `${VAR}`s expanded."""

    key: str
    source: str  # the file, for messages
    line: int
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    prefix: str = ""
    tools: tuple[str, ...] | None = None  # None: every tool the server lists
    effects: Mapping[str, Effect] = field(default_factory=dict)
    timeout: float = DEFAULT_TIMEOUT
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    auth: Auth = "service"
    label: str = ""  # per_user: the connection's name for people ("" : the key)
    scopes: tuple[str, ...] = ()  # per_user: asked for when a person connects

    @property
    def per_user(self) -> bool:
        return self.auth == "per_user"

    @property
    def connection(self) -> str:
        """The provider of a per-user server's connections ("mcp:docs"); "" otherwise."""
        return f"mcp:{self.key}" if self.per_user else ""

    @property
    def connection_label(self) -> str:
        """The connection's name for people ("Docs")."""
        return self.label or self.key

    @property
    def transport(self) -> Transport:
        return "stdio" if self.command is not None else "http"

    @property
    def where(self) -> str:
        """How messages name this server: "MCP server 'git' (mcp.yaml line 2)"."""
        return f"MCP server '{self.key}' ({self.source} line {self.line})"

    @property
    def target(self) -> str:
        """What it connects to, for people (no header values: they may hold secrets)."""
        if self.command is not None:
            return " ".join([self.command, *self.args])
        return str(self.url)

    def tool_name(self, server_name: str) -> str:
        """The name the model, the policy and the approvals see."""
        return self.prefix + server_name


def resolve_command(command: str) -> str:
    """The program a stdio server's `command:` starts. A path (it has a `/`) is used as it is;
    a bare name is looked up on PATH, as a shell would, and then beside the running Python,
    where pip puts the scripts of packages installed with Switchboard (`pip install
    mcp-server-git` into the same virtualenv), so a service started as
    `/opt/venv/bin/switchboard` finds them without an activated virtualenv. A name found in
    neither is left as it is, and starting it fails with "command not found"."""
    if os.sep in command or (os.altsep and os.altsep in command):
        return command
    for place in (None, *command_places()[1:]):
        found = shutil.which(command, path=place)
        if found:
            return found
    return command


def command_places() -> list[str]:
    """Where `resolve_command` looks, in order: PATH, then the running Python's script
    folders (a virtualenv's `bin`)."""
    places = ["PATH"]
    for folder in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        if folder and folder not in places:
            places.append(folder)
    return places


def read_config(
    text: str, source: str, environ: Mapping[str, str] | None = None
) -> list[ServerConfig]:
    """Parse and check an MCP servers document; raise McpConfigError listing every problem."""
    root = compose(text, source, McpConfigError)
    reader = _Reader(source, os.environ if environ is None else environ)
    servers = reader.document(root)
    reader.raise_errors(McpConfigError)
    return servers


def expand(value: str, environ: Mapping[str, str]) -> tuple[str, list[str]]:
    """`value` with `${VAR}` taken from `environ` (and `$${` kept as a literal `${`);
    returns the text and the names of the variables that are not set."""
    missing: list[str] = []

    def replace(match: re.Match[str]) -> str:
        escaped, name = match.group(1), match.group(2)
        if escaped:
            return "${" + name + "}"
        if name not in environ:
            missing.append(name)
            return ""
        return environ[name]

    return _VARIABLE.sub(replace, value), missing


class _Reader(NodeReader):
    def __init__(self, source: str, environ: Mapping[str, str]) -> None:
        super().__init__(source)
        self.environ = environ
        self._constructor = yaml.SafeLoader("")

    def document(self, root: Node | None) -> list[ServerConfig]:
        if root is None or _is_null(root):
            self.error(None, "no servers: add a `servers:` mapping, or unset SWITCHBOARD_MCP")
            return []
        sections: dict[str, tuple[Node, Node]] = {}
        with suppress(_Invalid):
            sections = self.mapping(root, "the file", ("servers",))
        if "servers" not in sections:
            if not self.errors:
                self.error(root, "no servers: add a `servers:` mapping")
            return []
        servers = []
        entries: dict[str, tuple[Node, Node]] = {}
        with suppress(_Invalid):
            entries = self.mapping(sections["servers"][1], "servers")
        for key, (key_node, value) in entries.items():
            if not KEY_PATTERN.match(key):
                self.error(
                    key_node,
                    f"servers: {key!r} is not a valid server key: use 1-40 letters, digits, "
                    "'_' or '-' (it is also the default tool name prefix)",
                )
                continue
            with suppress(_Invalid):
                servers.append(self.server(key, key_node, value))
        if not servers and not self.errors:
            self.error(
                sections["servers"][1], "servers is empty: add one, or unset SWITCHBOARD_MCP"
            )
        return servers

    def server(self, key: str, key_node: Node, node: Node) -> ServerConfig:
        where = f"servers.{key}"
        fields = self.mapping(node, where, SERVER_KEYS)
        has_command, has_url = "command" in fields, "url" in fields
        if has_command == has_url:
            raise self.invalid(
                key_node,
                f"{where}: give either `command:` (a stdio server) or `url:` (streamable "
                "HTTP), not " + ("both" if has_command else "neither"),
            )
        wrong = [k for k in (HTTP_ONLY if has_command else STDIO_ONLY) if k in fields]
        for name in wrong:
            kind = "stdio servers (`command:`)" if name in STDIO_ONLY else "`url:` servers"
            self.error(fields[name][0], f"{where}.{name} only applies to {kind}")
        values: dict[str, Any] = {"prefix": f"{key}_"}
        auth_known = True  # `auth:` absent, or a value that reads
        if "auth" in fields:
            try:
                values["auth"] = self.auth(fields["auth"][1], f"{where}.auth", has_url)
            except _Invalid:
                auth_known = False  # its label: and scopes: are not reported as well
        for name, (_, value) in fields.items():
            if name in wrong or name == "auth":
                continue
            if name in PER_USER_ONLY and values.get("auth") != "per_user":
                if auth_known:
                    self.error(
                        fields[name][0],
                        f"{where}.{name} only applies to a server with `auth: per_user`",
                    )
                continue
            with suppress(_Invalid):
                values[name] = self.field(name, value, f"{where}.{name}")
        if "url" in values and not re.match(r"^https?://", values["url"]):
            self.error(fields["url"][1], f"{where}.url must start with http:// or https://")
        return ServerConfig(
            key=key, source=self.source, line=key_node.start_mark.line + 1, **values
        )

    def field(self, name: str, node: Node, where: str) -> Any:
        if name in ("command", "cwd", "url"):
            text = self.text(node, where)
            if not text:
                raise self.invalid(node, f"{where} is empty")
            return text
        if name == "args":
            return tuple(self.text(item, f"{where}[{n}]") for n, item in self.items(node, where))
        if name in ("env", "headers"):
            return MappingProxyType(
                {k: self.text(v, f"{where}.{k}") for k, (_, v) in self.mapping(node, where).items()}
            )
        if name == "prefix":
            prefix = self.text(node, where, expand_variables=False)
            if not PREFIX_PATTERN.match(prefix):
                raise self.invalid(
                    node, f"{where}: {prefix!r} is invalid: use up to 40 letters, digits, _ or -"
                )
            return prefix
        if name == "tools":
            return self.tool_names(node, where)
        if name == "effects":
            return self.effects(node, where)
        if name == "label":
            label = self.text(node, where, expand_variables=False).strip()
            if not label or len(label) > MAX_LABEL or not label.isprintable():
                raise self.invalid(
                    node, f"{where} must be 1-{MAX_LABEL} printable characters, e.g. Docs"
                )
            return label
        if name == "scopes":
            return self.scopes(node, where)
        return self.seconds(node, where)

    def auth(self, node: Node, where: str, has_url: bool) -> Auth:
        """`service` (the default: `headers:` go with every call) or `per_user`."""
        auth = self.text(node, where, expand_variables=False)
        if auth not in ("service", "per_user"):
            raise self.invalid(
                node,
                f"{where} must be per_user (each call acts as the person asking) or service "
                f"(the default: the server's own credentials), got {auth[:40]!r}",
            )
        if auth == "per_user" and not has_url:
            raise self.invalid(
                node,
                f"{where}: per_user only applies to `url:` servers (a remote MCP server with "
                "its own OAuth); a stdio server acts with the credentials it is started with",
            )
        return "per_user" if auth == "per_user" else "service"

    def scopes(self, node: Node, where: str) -> tuple[str, ...]:
        scopes: list[str] = []
        items = self.items(node, where)
        if len(items) > MAX_SCOPES:
            raise self.invalid(node, f"{where} lists {len(items)} scopes: at most {MAX_SCOPES}")
        for n, item in items:
            if not (isinstance(item, yaml.ScalarNode) and item.tag == _STR):
                # an OAuth scope is text: `0` or `true` unquoted would be read back changed
                self.error(item, f"{where}[{n}] must be text (quote it)")
                continue
            scope = self.text(item, f"{where}[{n}]", expand_variables=False)
            if not _SCOPE.match(scope):
                self.error(item, f"{where}[{n}]: {scope[:40]!r} is not an OAuth scope")
            elif scope not in scopes:
                scopes.append(scope)
        return tuple(scopes)

    def tool_names(self, node: Node, where: str) -> tuple[str, ...]:
        names: list[str] = []
        for _, item in self.items(node, where):
            name = self.text(item, where, expand_variables=False)
            if name in names:
                self.error(item, f"{where}: {name!r} is listed twice")
            else:
                names.append(name)
        if not names:
            raise self.invalid(node, f"{where} is empty: list tools, or leave it out for all")
        return tuple(names)

    def effects(self, node: Node, where: str) -> Mapping[str, Effect]:
        effects: dict[str, Effect] = {}
        for name, (_, value) in self.mapping(node, where).items():
            effect = self.text(value, f"{where}.{name}", expand_variables=False)
            if effect == "read":
                effects[name] = "read"
            elif effect == "write":
                effects[name] = "write"
            else:
                self.error(value, f"{where}.{name} must be read or write, got {effect!r}")
        return MappingProxyType(effects)

    def seconds(self, node: Node, where: str) -> float:
        if not (isinstance(node, yaml.ScalarNode) and node.tag in (_INT, _FLOAT)):
            raise self.invalid(node, f"{where} must be a number of seconds, e.g. 30")
        value = float(self._constructor.construct_object(node, deep=True))
        if not (math.isfinite(value) and 0 < value <= MAX_SECONDS):
            raise self.invalid(node, f"{where} must be more than 0 and at most {MAX_SECONDS:g}")
        return value

    # -- typed values ---------------------------------------------------------

    def text(self, node: Node, where: str, *, expand_variables: bool = True) -> str:
        if not isinstance(node, yaml.ScalarNode) or node.tag in (_NULL, _BOOL):
            raise self.invalid(node, f"{where} must be text (quote it if YAML reads it otherwise)")
        value = str(node.value)
        if not expand_variables:
            return value
        expanded, missing = expand(value, self.environ)
        if missing:
            names = ", ".join(dict.fromkeys(missing))
            raise self.invalid(
                node, f"{where} uses ${{{missing[0]}}}, but {names} is not set in the environment"
            )
        return expanded

    def items(self, node: Node, where: str) -> list[tuple[int, Node]]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.invalid(node, f"{where} must be a list, e.g. [a, b]")
        return list(enumerate(node.value))
