"""Edit and reject-with-instructions at the console's prompt, as a person types them: a real
`switchboard chat` in a pseudo-terminal (with the worker it starts), the test's Redis and
the fake model."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from switchboard.edit_args import EditInputError, read_value, with_assignments
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.support.processes import MARK, ROOT, kill_marked, worker_env
from tests.support.runtime import tool_messages
from tests.support.terminal import Terminal
from tools.builtin.tickets import TicketStore

CREATE = Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "Mouse broken"})])


@pytest.fixture
def chat(
    redis_conn: redis.Redis, redis_url: str, model_server: FakeOpenAI, tmp_path: Path
) -> Iterator[Terminal]:
    mark = uuid.uuid4().hex
    env = worker_env(redis_url, model_server.url, tmp_path, **{MARK: mark})
    terminal = Terminal(["chat"], env, ROOT)
    try:
        terminal.expect("you> ", timeout=60)
        yield terminal
    finally:
        terminal.close()
        kill_marked(mark)


@pytest.mark.slow  # starts `switchboard chat` and the worker it starts
def test_edit_field_by_field_then_instruct_at_the_console_prompt(
    chat: Terminal, model_server: FakeOpenAI, tmp_path: Path
) -> None:
    model_server.route("Mouse", [CREATE, "Filed it as you edited it."])
    model_server.route("Keyboard", [CREATE, "Understood, I asked facilities."])
    chat.send("Mouse broken at desk 4, file it")
    chat.expect("approve? [y]es / [e]dit", timeout=60)
    chat.send("e")
    for field, answer in (
        ("body", ""),  # Enter keeps it
        ("priority", "soon"),
        ("project", ""),
        ("title", "Mouse and keyboard broken"),
    ):
        chat.expect(f"    {field} [")
        chat.send(answer)
    chat.expect("'soon' is not one of")  # the schema's check, then that field again
    chat.expect('priority ["soon"]: ')
    chat.send("urgent")
    chat.expect("Filed it as you edited it.", timeout=60)
    ticket = TicketStore(tmp_path / "tickets.sqlite3").get(1)
    assert ticket is not None
    assert (ticket["title"], ticket["priority"]) == ("Mouse and keyboard broken", "urgent")

    chat.send("Keyboard broken too, file it")
    chat.expect("approve? [y]es / [e]dit", timeout=60)
    chat.send("i")
    chat.expect("tell the agent what to do instead: ")
    chat.send("ask facilities, they own the desks")
    chat.expect("reason (optional): ")
    chat.send("not IT's")
    chat.expect("Understood, I asked facilities.", timeout=60)
    observation = tool_messages(model_server.last_chat_request)[-1]
    assert "ask facilities, they own the desks" in observation and "not IT's" in observation
    assert TicketStore(tmp_path / "tickets.sqlite3").count_executions("create_ticket") == 1


SCHEMAS = st.sampled_from(
    [
        {"type": "string"},
        {"type": "integer"},
        {"type": ["string", "null"]},
        {"enum": ["low", "high"]},
        {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        {},
        None,
    ]
)


@given(schema=SCHEMAS, text=st.text(max_size=40))
@settings(max_examples=100, deadline=None)
def test_a_typed_value_is_read_for_its_field_or_refused_in_words(schema: Any, text: str) -> None:
    try:
        value = read_value(schema, text)
    except EditInputError as exc:
        assert "not a JSON value" in str(exc)
        return
    if isinstance(schema, dict) and schema.get("type") in ("string", ["string", "null"]):
        assert value == text  # a string field takes the text as typed


@given(assignments=st.lists(st.text(max_size=20), max_size=5))
@settings(max_examples=100, deadline=None)
def test_assignments_either_apply_or_say_what_is_wrong(assignments: list[str]) -> None:
    properties = {"title": {"type": "string"}, "count": {"type": "integer"}}
    try:
        edited = with_assignments({"title": "x"}, properties, assignments)
    except EditInputError:
        return
    assert set(edited) <= {"title", "count"}
