"""What a per-user MCP server's 403 `insufficient_scope` challenge is read as: the scope
tokens it names (RFC 6749 3.3 syntax, bounded), whatever the server writes in its header."""

from __future__ import annotations

import asyncio
import string

import httpx2
from hypothesis import given
from hypothesis import strategies as st

from tools.exceptions import MAX_SCOPE_CHARS, MAX_SCOPES, NeedsMoreAccess, scope_tokens
from tools.mcp.session import MAX_CHALLENGE_CHARS, BearerAnswers, bearer_params, short_of_scope

SCOPE_CHARS = st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters='"\\')
SCOPE = st.text(SCOPE_CHARS, min_size=1, max_size=MAX_SCOPE_CHARS)


def well_formed(token: str) -> bool:
    return 0 < len(token) <= MAX_SCOPE_CHARS and all(
        "!" <= ch <= "~" and ch not in '"\\' for ch in token
    )


@given(st.text(max_size=3000))
def test_any_text_gives_well_formed_scope_tokens_once_each_and_bounded(text: str) -> None:
    tokens = scope_tokens(text)
    assert len(tokens) <= MAX_SCOPES and len(set(tokens)) == len(tokens)
    assert all(well_formed(t) for t in tokens)
    assert all(t in text.split(" ") for t in tokens)  # taken from the text, never made up


@given(st.lists(SCOPE, max_size=MAX_SCOPES, unique=True))
def test_well_formed_scopes_read_back_as_written(scopes: list[str]) -> None:
    assert scope_tokens(" ".join(scopes)) == tuple(scopes)


def test_a_scope_with_a_quote_backslash_or_control_character_is_left_out() -> None:
    assert scope_tokens('read "write" a\\b c\x00d files:read  ') == ("read", "files:read")
    assert scope_tokens("x" * (MAX_SCOPE_CHARS + 1) + " ok") == ("ok",)
    assert len(scope_tokens(" ".join(f"s{i}" for i in range(MAX_SCOPES * 3)))) == MAX_SCOPES


def challenge(status: int, header: str | None) -> httpx2.Response:
    headers = {"WWW-Authenticate": header} if header is not None else {}
    return httpx2.Response(status, headers=headers)


@given(st.lists(SCOPE, min_size=1, max_size=5, unique=True))
def test_a_403_insufficient_scope_names_its_scope(scopes: list[str]) -> None:
    wanted = " ".join(scopes)
    header = f'Bearer error="insufficient_scope", scope="{wanted}", resource_metadata="x"'
    named = short_of_scope(challenge(403, header))
    assert named == wanted
    assert NeedsMoreAccess("mcp:people", "People", named).scopes == tuple(scopes)


def test_only_a_403_that_says_insufficient_scope_is_a_scope_challenge() -> None:
    assert short_of_scope(challenge(403, 'Bearer error="insufficient_scope"')) == ""
    assert short_of_scope(challenge(403, 'Bearer error="invalid_token", scope="a"')) is None
    assert short_of_scope(challenge(403, None)) is None
    assert short_of_scope(challenge(401, 'Bearer error="insufficient_scope", scope="a"')) is None
    assert short_of_scope(challenge(200, None)) is None


TOKEN = st.text(
    st.sampled_from("!#$%&'*+.^_`|~-" + string.ascii_letters + string.digits), min_size=1
)
VALUE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=80)


def quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@given(st.dictionaries(TOKEN.map(str.lower), VALUE, max_size=6), st.booleans())
def test_a_bearer_challenges_parameters_read_back_whatever_their_quoted_text_says(
    params: dict[str, str], other_scheme_first: bool
) -> None:
    """Values hold commas, `=`, quotes, backslashes and `scope=...` of their own: each is
    read as the parameter it belongs to."""
    text = ", ".join(f"{name}={quoted(value)}" for name, value in params.items())
    header = ('Basic realm="x, y", ' if other_scheme_first else "") + f"Bearer {text}"
    assert bearer_params(header) == params


def test_a_scope_mentioned_in_another_parameter_is_not_the_scope() -> None:
    header = 'Bearer error="insufficient_scope", error_description="needs scope=admin:org"'
    assert short_of_scope(challenge(403, header)) == ""
    assert short_of_scope(challenge(403, header + ', scope="files:read"')) == "files:read"
    assert bearer_params("Bearer error=insufficient_scope, scope=a") == {
        "error": "insufficient_scope",
        "scope": "a",
    }


PARAM = st.tuples(
    st.sampled_from(["scope", "error", "Realm", "a-b"]),
    st.sampled_from(["", " "]),
    st.text(st.sampled_from('ab= ,"\\:'), max_size=12),
)


@given(st.text(max_size=40), st.lists(PARAM, max_size=4))
def test_any_bearer_challenge_reads_as_parameters_it_names_never_an_error(
    before: str, pieces: list[tuple[str, str, str]]
) -> None:
    """Whatever comes before `Bearer`, and parameters whose values may be malformed
    (unbalanced quotes, stray commas and `=`): those read are named in the header, in lower
    case, and a well-formed first parameter is always read."""
    header = f"{before} Bearer " + ", ".join(f"{k}{sp}={sp}{v}" for k, sp, v in pieces)
    params = bearer_params(header)
    assert all(k == k.lower() and k in header.lower() for k in params)
    assert all(len(v) <= len(header) for v in params.values())
    if pieces and "bearer" not in before.lower() and all(c not in pieces[0][2] for c in ' ,"\\'):
        name, _, value = pieces[0]
        assert params[name.lower()] == value


def test_only_the_first_characters_of_a_header_are_read() -> None:
    padding = "Basic realm=" + "x" * MAX_CHALLENGE_CHARS
    assert bearer_params("Bearer scope=early, realm=" + "x" * MAX_CHALLENGE_CHARS) == {
        "scope": "early",
        "realm": "x" * (MAX_CHALLENGE_CHARS - len("Bearer scope=early, realm=")),
    }
    assert bearer_params(padding + ", Bearer scope=late") == {}


def post(status: int, body: dict[str, object], header: str | None = None) -> httpx2.Response:
    request = httpx2.Request("POST", "http://mcp.example/mcp", json=body)
    headers = {"WWW-Authenticate": header} if header else {}
    return httpx2.Response(status, headers=headers, request=request)


CALL = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "note"}}
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
SHORT = 'Bearer error="insufficient_scope", scope="admin"'


def answers(*responses: httpx2.Response) -> BearerAnswers:
    said = BearerAnswers()
    for response in responses:
        asyncio.run(said.seen(response))
    return said


def test_only_a_refusal_before_the_call_was_answered_says_the_call_did_not_run() -> None:
    # refused at the handshake, or the call itself refused: nothing ran
    assert answers(post(403, INIT, SHORT)).short_of == "admin"
    assert answers(post(200, INIT), post(403, CALL, SHORT)).short_of == "admin"
    assert answers(post(200, INIT), post(401, CALL)).refused
    # the call was answered (a proxy's 500 after the tool ran, say): what comes after, on
    # the session's other requests or its close, says nothing about it
    closing = httpx2.Response(
        403,
        headers={"WWW-Authenticate": SHORT},
        request=httpx2.Request("DELETE", "http://mcp.example/mcp"),
    )
    late = answers(post(200, INIT), post(500, CALL), post(401, INIT), closing)
    assert late.answered and not late.refused and late.short_of is None
    stream = httpx2.Response(401, request=httpx2.Request("GET", "http://mcp.example/mcp"))
    assert not answers(post(200, INIT), stream).refused
    # a redirect (/mcp/ -> /mcp, followed by the SDK) answers nothing: the refusal after it
    # is the call's
    moved = httpx2.Response(
        307,
        headers={"Location": "/mcp"},
        request=httpx2.Request("POST", "http://mcp.example/mcp/", json=CALL),
    )
    assert answers(post(200, INIT), moved, post(403, CALL, SHORT)).short_of == "admin"
