"""The MCP servers file (SWITCHBOARD_MCP): its public shape, `${VAR}` expansion, and an error
naming the line for everything an operator can get wrong. Operator text reaches the parser,
so properties are checked against whatever hypothesis types."""

from __future__ import annotations

import contextlib
import json
import re
import string

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st
from mcp import types

from tools.exceptions import McpConfigError, ToolDefinitionError
from tools.mcp import effect_of, expand, parameters_of, read_config
from tools.mcp.bridge import make_tool
from tools.mcp.loop import shared_loop
from tools.mcp.session import Connection
from tools.registry import NAME_PATTERN
from tools.schema import usable_defaults, with_defaults

# The example from the issue, as an operator would write it.
EXAMPLE = """\
servers:
  git:                                   # a key of your choosing
    command: mcp-server-git              # stdio transport...
    args: ["--repository", "/srv/repo"]
    env: {GIT_AUTHOR_NAME: Switchboard}  # ${VAR} is expanded from the environment
    prefix: ""                           # tool name = prefix + the server's name
  docs:
    url: https://mcp.example.com/mcp     # ...or streamable HTTP
    headers: {Authorization: "Bearer ${DOCS_TOKEN}"}
    tools: [search, fetch]               # optional allow-list (the server's own names)
    effects: {search: read}              # optional override of the annotations
    timeout: 30                          # seconds per call
"""


def test_the_documented_example_reads_as_written() -> None:
    git, docs = read_config(EXAMPLE, "mcp.yaml", {"DOCS_TOKEN": "s3cret"})
    assert (git.key, git.line, git.transport, git.command) == ("git", 2, "stdio", "mcp-server-git")
    assert git.args == ("--repository", "/srv/repo")
    assert dict(git.env) == {"GIT_AUTHOR_NAME": "Switchboard"}
    assert git.prefix == "" and git.tool_name("git_status") == "git_status"
    assert git.tools is None and git.timeout == 30.0
    assert (docs.transport, docs.url) == ("http", "https://mcp.example.com/mcp")
    assert dict(docs.headers) == {"Authorization": "Bearer s3cret"}
    assert docs.prefix == "docs_" and docs.tool_name("search") == "docs_search"  # the default
    assert docs.tools == ("search", "fetch") and dict(docs.effects) == {"search": "read"}
    assert docs.where == "MCP server 'docs' (mcp.yaml line 7)"
    assert "s3cret" not in docs.target  # headers can hold secrets: never shown


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "mcp.yaml line 1: no servers"),
        ("servers: {}\n", "mcp.yaml line 1: servers is empty"),
        ("server:\n  a: {command: x}\n", "line 1: the file: unknown key 'server' (did you mean"),
        ("servers:\n  a: {}\n", "line 2: servers.a: give either `command:` (a stdio server)"),
        (
            "servers:\n  a: {command: x, url: 'http://h/mcp'}\n",
            "line 2: servers.a: give either `command:` (a stdio server) or `url:` (streamable "
            "HTTP), not both",
        ),
        ("servers:\n  a: {url: 'ftp://h'}\n", "line 2: servers.a.url must start with http://"),
        (
            "servers:\n  a:\n    url: http://h/mcp\n    env: {A: b}\n",
            "line 4: servers.a.env only applies to stdio servers (`command:`)",
        ),
        (
            "servers:\n  a:\n    command: x\n    headers: {A: b}\n",
            "line 4: servers.a.headers only applies to `url:` servers",
        ),
        ("servers:\n  a:\n    command: x\n    comand: y\n", "unknown key 'comand' (did you"),
        ("servers:\n  a.b: {command: x}\n", "line 2: servers: 'a.b' is not a valid server key"),
        ("servers:\n  a: {command: x, prefix: 'a.'}\n", "servers.a.prefix: 'a.' is invalid"),
        ("servers:\n  a: {command: x, timeout: 0}\n", "servers.a.timeout must be more than 0"),
        ("servers:\n  a: {command: x, timeout: soon}\n", "servers.a.timeout must be a number"),
        ("servers:\n  a: {command: x, tools: []}\n", "servers.a.tools is empty"),
        ("servers:\n  a: {command: x, tools: [t, t]}\n", "servers.a.tools: 't' is listed twice"),
        (
            "servers:\n  a: {command: x, effects: {t: readonly}}\n",
            "servers.a.effects.t must be read or write, got 'readonly'",
        ),
        ("servers:\n  a: {command: x, args: [yes]}\n", "servers.a.args[0] must be text (quote"),
        (
            "servers:\n  a:\n    command: x\n    env: {TOKEN: '${NOPE_UNSET}'}\n",
            "line 4: servers.a.env.TOKEN uses ${NOPE_UNSET}, but NOPE_UNSET is not set",
        ),
        ("servers:\n  a: [command]\n", "servers.a must be a mapping"),
        ("servers: [\n", "mcp.yaml line 2: invalid YAML"),
        (
            "servers:\n  a:\n    url: http://h/mcp\n    auth: perUser\n",
            "line 4: servers.a.auth must be per_user (each call acts as the person asking) or "
            "service (the default",
        ),
        (
            "servers:\n  a:\n    command: x\n    auth: per_user\n",
            "line 4: servers.a.auth: per_user only applies to `url:` servers",
        ),
        (
            "servers:\n  a:\n    url: http://h/mcp\n    label: Docs\n",
            "line 4: servers.a.label only applies to a server with `auth: per_user`",
        ),
        (
            "servers:\n  a:\n    url: http://h/mcp\n    auth: service\n    scopes: [read]\n",
            "line 5: servers.a.scopes only applies to a server with `auth: per_user`",
        ),
        (
            "servers:\n  a: {url: 'http://h/mcp', auth: per_user, scopes: ['a b']}\n",
            "line 2: servers.a.scopes[0]: 'a b' is not an OAuth scope",
        ),
        (
            "servers:\n  a: {url: 'http://h/mcp', auth: per_user, scopes: read}\n",
            "servers.a.scopes must be a list",
        ),
        (
            "servers:\n  a: {url: 'http://h/mcp', auth: per_user, label: ''}\n",
            "servers.a.label must be 1-40 printable characters",
        ),
        ("servers:\n  a: {url: 'http://h/mcp', auth: [per_user]}\n", "servers.a.auth must be text"),
    ],
)
def test_every_mistake_names_its_line_and_the_fix(text: str, expected: str) -> None:
    with pytest.raises(McpConfigError) as caught:
        read_config(text, "mcp.yaml", {})
    assert expected in str(caught.value)


def test_a_per_user_server_reads_with_its_connection_and_listing_headers() -> None:
    text = """\
servers:
  docs:
    url: https://mcp.example.com/mcp
    auth: per_user            # every call carries the asking person's own token
    label: Docs
    scopes: [read, "docs:write", read]
    headers: {Authorization: "Bearer ${DOCS_LIST_TOKEN}"}   # used only to list the tools
  open:
    url: https://open.example.com/mcp
    auth: per_user
  plain:
    url: https://plain.example.com/mcp
    auth: service
"""
    docs, open_, plain = read_config(text, "mcp.yaml", {"DOCS_LIST_TOKEN": "list-only"})
    assert (docs.per_user, docs.connection, docs.connection_label) == (True, "mcp:docs", "Docs")
    assert docs.scopes == ("read", "docs:write") and docs.headers == {
        "Authorization": "Bearer list-only"
    }
    assert (open_.connection, open_.connection_label, open_.scopes) == ("mcp:open", "open", ())
    assert not open_.headers  # it lists openly
    assert (plain.per_user, plain.connection) == (False, "")
    (stdio,) = read_config("servers:\n  s: {command: x}\n", "mcp.yaml", {})
    assert (stdio.auth, stdio.connection) == ("service", "")


def test_a_bad_auth_is_reported_once_not_again_for_its_label_and_scopes() -> None:
    text = "servers:\n  a:\n    url: http://h/mcp\n    auth: oauth\n    label: D\n    scopes: [r]\n"
    with pytest.raises(McpConfigError) as caught:
        read_config(text, "mcp.yaml", {})
    assert str(caught.value).splitlines() == [
        "mcp.yaml line 4: servers.a.auth must be per_user (each call acts as the person asking) "
        "or service (the default: the server's own credentials), got 'oauth'"
    ]


def test_every_problem_in_a_file_is_reported_at_once() -> None:
    text = "servers:\n  a: {command: x, timeout: -1}\n  b: {}\n  c: {url: 'h'}\n"
    with pytest.raises(McpConfigError) as caught:
        read_config(text, "mcp.yaml", {})
    lines = str(caught.value).splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "mcp.yaml line 2",
        "mcp.yaml line 3",
        "mcp.yaml line 4",
    ]


def test_variables_expand_and_dollar_dollar_keeps_a_literal() -> None:
    environ = {"A": "1", "B_2": "two"}
    assert expand("x${A}y${B_2}", environ) == ("x1ytwo", [])
    assert expand("$${A} and $A and ${", environ) == ("${A} and $A and ${", [])
    assert expand("${MISSING}${A}${OTHER}", environ) == ("1", ["MISSING", "OTHER"])


ANNOTATION_CASES = [
    (None, "write"),  # no annotations at all: fail safe
    ({}, "write"),
    ({"readOnlyHint": False}, "write"),
    ({"readOnlyHint": True}, "read"),
    ({"readOnlyHint": True, "destructiveHint": True}, "read"),  # destructive only for writes
    ({"destructiveHint": False, "idempotentHint": True}, "write"),
]


@pytest.mark.parametrize(("annotations", "effect"), ANNOTATION_CASES)
def test_only_read_only_hint_true_makes_a_read(annotations: dict | None, effect: str) -> None:
    (config,) = read_config("servers:\n  s: {command: x}\n", "mcp.yaml", {})
    tool = types.Tool.model_validate(
        {"name": "t", "inputSchema": {"type": "object"}, "annotations": annotations}
    )
    assert effect_of(tool, config) == effect
    (overridden,) = read_config("servers:\n  s: {command: x, effects: {t: read}}\n", "mcp.yaml", {})
    assert effect_of(tool, overridden) == "read"


# -- properties: operator text ----------------------------------------------------------------

NAME_CHARS = string.ascii_letters + string.digits + "_-"
server_names = st.text(NAME_CHARS + ".:/ ", min_size=1, max_size=70)
prefixes = st.text(NAME_CHARS, max_size=40)


@settings(max_examples=300, deadline=None)
@given(prefix=prefixes, name=server_names)
def test_a_tool_is_named_prefix_plus_the_servers_name_or_refused_with_the_fix(
    prefix: str, name: str
) -> None:
    (config,) = read_config(
        yaml.safe_dump({"servers": {"s": {"command": "x", "prefix": prefix}}}), "mcp.yaml", {}
    )
    listed = types.Tool.model_validate({"name": name, "inputSchema": {"type": "object"}})
    connection = Connection(config, shared_loop())  # never started: naming needs no server
    valid = re.fullmatch(r"[A-Za-z0-9_-]{1,64}", prefix + name) is not None
    try:
        made = make_tool(config, connection, listed)
    except ToolDefinitionError as error:
        assert not valid
        assert f"would be named {prefix + name!r}" in str(error) and "`tools:`" in str(error)
        return
    assert valid and made.name == prefix + name and NAME_PATTERN.match(made.name)
    assert made.source == "MCP server s" and made.effect == "write"


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=12,
)
server_keys = st.sampled_from(
    [
        *("command", "args", "env", "cwd", "url", "headers", "prefix", "tools", "effects"),
        *("timeout", "auth", "label", "scopes"),
    ]
)
entry_values = st.one_of(values, st.sampled_from(["per_user", "service", "http://h/mcp"]))


@settings(max_examples=200, deadline=None)
@given(
    servers=st.dictionaries(
        st.text(max_size=12), st.dictionaries(server_keys, entry_values, max_size=5), max_size=3
    )
)
def test_any_servers_document_loads_or_fails_with_one_config_error(servers: dict) -> None:
    text = yaml.safe_dump({"servers": servers})
    try:
        configs = read_config(text, "mcp.yaml", {"HOME": "/home/x"})
    except McpConfigError as error:
        assert all(line.startswith("mcp.yaml line ") for line in str(error).splitlines())
        return
    for config in configs:
        assert (config.command is None) != (config.url is None)
        assert NAME_PATTERN.match(config.key)
        assert config.timeout > 0 and config.connect_timeout > 0
        assert config.auth in ("service", "per_user")
        if config.per_user:  # only a `url:` server acts per user; its provider is its own
            assert config.url is not None and config.connection == f"mcp:{config.key}"
        else:  # label and scopes only come with per_user
            assert (config.connection, config.label, config.scopes) == ("", "", ())


@settings(max_examples=200, deadline=None)
@given(
    auth=st.one_of(st.none(), st.sampled_from(["per_user", "service"]), values),
    extra=st.dictionaries(
        st.sampled_from(["label", "scopes", "headers", "command"]),
        st.one_of(values, st.lists(st.text(max_size=12), max_size=4)),
        max_size=3,
    ),
)
@example(auth="per_user", extra={"scopes": [0]})  # unquoted: not text, refused (found in CI)
@example(auth="per_user", extra={"label": 0})  # a number: its text is the label
def test_any_auth_label_and_scopes_load_as_a_per_user_server_or_fail_naming_the_line(
    auth: object, extra: dict
) -> None:
    entry = {"url": "http://h/mcp", **extra, **({} if auth is None else {"auth": auth})}
    try:
        (config,) = read_config(yaml.safe_dump({"servers": {"s": entry}}), "mcp.yaml", {})
    except McpConfigError as error:
        assert all(line.startswith("mcp.yaml line ") for line in str(error).splitlines())
        return
    assert "command" not in extra and config.auth == (auth or "service")
    assert config.per_user == (auth == "per_user")
    if config.per_user:
        assert config.connection == "mcp:s"
        label = extra.get("label")
        if label is None:
            assert config.connection_label == "s"
        else:  # text, or a number YAML wrote unquoted: the loader reads its scalar as text
            scalar = yaml.compose(yaml.safe_dump(label))
            assert scalar is not None and config.connection_label == str(scalar.value).strip()
        assert set(config.scopes) == set(extra.get("scopes") or ())
    else:
        assert "label" not in extra and "scopes" not in extra


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200))
def test_any_text_at_all_loads_or_fails_with_one_config_error(text: str) -> None:
    with contextlib.suppress(McpConfigError):
        read_config(text, "mcp.yaml", {})


@settings(max_examples=300, deadline=None)
@given(value=st.text(max_size=60), environ=st.dictionaries(st.sampled_from("ABC"), st.text()))
def test_expansion_never_raises_and_names_exactly_the_unset_variables(
    value: str, environ: dict[str, str]
) -> None:
    expanded, missing = expand(value, environ)
    wanted = re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)\}", value)
    assert set(missing) <= set(wanted)
    assert all(name not in environ for name in missing)
    if not re.search(r"\$\$?\{[A-Za-z_]", value):
        assert expanded == value


def test_only_defaults_their_own_schema_accepts_are_filled_in() -> None:
    listed = types.Tool.model_validate(
        {
            "name": "t",
            "inputSchema": {
                "type": "object",
                "title": "tArguments",
                "$defs": {"Size": {"enum": ["s", "m"], "title": "Size"}},
                "properties": {
                    "title": {"type": "string", "title": "Title"},  # a property named title
                    "size": {"$ref": "#/$defs/Size", "default": "m"},
                    "label": {"type": "string", "default": None},  # pydantic's `str = None`
                    "tags": {"type": "array", "items": {"type": "string"}, "default": []},
                },
                "required": ["title"],
            },
        }
    )
    parameters = parameters_of(listed)
    assert "title" in parameters["properties"] and '"title": "' not in json.dumps(parameters)
    assert parameters["additionalProperties"] is False
    defaults = usable_defaults(parameters)
    assert defaults == {"size": "m", "tags": []}
    filled = with_defaults({"title": "x"}, defaults)
    assert filled == {"title": "x", "size": "m", "tags": []}
    filled["tags"].append("mutated")
    assert with_defaults({"title": "y"}, defaults)["tags"] == []  # each call gets its own copy
