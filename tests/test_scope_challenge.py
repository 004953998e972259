"""What a per-user MCP server's 403 `insufficient_scope` challenge is read as: the scope
tokens it names (RFC 6749 3.3 syntax, bounded), whatever the server writes in its header."""

from __future__ import annotations

import httpx2
from hypothesis import given
from hypothesis import strategies as st

from tools.exceptions import MAX_SCOPE_CHARS, MAX_SCOPES, NeedsMoreAccess, scope_tokens
from tools.mcp.session import short_of_scope

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


@given(st.text(max_size=2000))
def test_any_www_authenticate_header_reads_as_a_scope_or_none_never_an_error(
    header: str,
) -> None:
    try:
        response = challenge(403, header)
    except (UnicodeEncodeError, ValueError):  # not a header httpx would have received
        return
    named = short_of_scope(response)
    assert named is None or isinstance(named, str)
    scope_tokens(named or "")
