"""The Edit modal's submission parser: whatever view.state.values a sender forges, the
outcome is valid canonical arguments or an error naming a field of the modal, never an
exception."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from approvals.edits import EditRefused, check_edit
from bot.render.edit_form import edit_modal, fields, read_edit, refusal_errors
from tools import register_tool
from tools.decode import canonical_json
from tools.policy import Policy
from tools.registry import ToolRegistry

REGISTRY = ToolRegistry()
TOOL = register_tool(
    name="book_room",
    description="Book a room.",
    parameters={
        "type": "object",
        "properties": {
            "room": {"type": "string", "minLength": 1, "maxLength": 40},
            "notes": {"type": "string", "maxLength": 2000},
            "seats": {"type": "integer", "minimum": 1, "maximum": 500},
            "budget": {"type": "number", "minimum": 0},
            "catering": {"type": "boolean"},
            "floor": {"enum": ["ground", "first", 2, None]},
            "guests": {"type": "array", "items": {"type": "string"}, "maxItems": 20},
            "extra": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "required": ["room", "seats"],
        "additionalProperties": False,
    },
    handler=lambda ctx, args: "booked",
    registry=REGISTRY,
)
POLICY = Policy.default(REGISTRY)
PROPOSED = {"room": "Oak", "seats": 4, "floor": "first", "guests": ["ann"], "catering": True}
BLOCKS = {f.block_id for f in fields(TOOL, PROPOSED)}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
text_states = st.fixed_dictionaries(
    {"type": st.just("plain_text_input"), "value": st.none() | st.text(max_size=60) | json_values}
)
json_texts = st.builds(json.dumps, json_values).map(
    lambda t: {"type": "plain_text_input", "value": t}
)
select_states = st.fixed_dictionaries(
    {
        "selected_option": st.none()
        | st.fixed_dictionaries({"value": st.text(max_size=4) | json_values})
    }
)
checkbox_states = st.fixed_dictionaries(
    {
        "selected_options": st.lists(
            st.fixed_dictionaries({"value": st.sampled_from(["true", "x"])})
        )
        | json_values
    }
)
states = text_states | json_texts | select_states | checkbox_states | json_values
submissions = st.dictionaries(
    st.sampled_from(sorted(BLOCKS)) | st.text(max_size=4),
    st.dictionaries(st.sampled_from(["v", "x"]), states, max_size=2) | json_values,
    max_size=10,
)


@pytest.mark.slow  # 400 recursive examples: 6-14 s here, ~50 s measured in the full suite
@settings(max_examples=400, deadline=None)
@given(values=submissions | json_values)
@example(values={"a0": {"v": {"type": "plain_text_input", "value": ""}}})
@example(values={"a2": {"v": {"type": "number_input", "value": "1e999"}}})
@example(values={"a6": {"v": {"type": "plain_text_input", "value": '1], "x": [2'}}})
@example(values={"a6": {"v": {"type": "plain_text_input", "value": "[" * 40 + "]" * 40}}})
@example(values={"a5": {"v": {"selected_option": {"value": "99"}}}})
def test_a_submission_is_valid_arguments_or_an_error_naming_a_field(values: Any) -> None:
    args, errors = read_edit(TOOL, PROPOSED, values)
    if args is None:
        assert errors and set(errors) <= BLOCKS
        assert all(isinstance(e, str) and 0 < len(e) <= 150 for e in errors.values())
        return
    assert errors == {}
    try:
        checked = check_edit(TOOL, POLICY, frozenset({"everyone"}), args)
    except EditRefused as refused:
        assert refused.field is None or refused.field in TOOL.parameters["properties"]
        named = refusal_errors(TOOL, PROPOSED, refused)
        assert len(named) == 1 and set(named) <= BLOCKS
        return
    assert TOOL.validate(checked) == checked
    canonical_json(checked)  # JSON, no NaN


def test_the_modal_prefills_every_kind_of_argument() -> None:
    view = edit_modal_for(PROPOSED)
    kinds = {
        b["label"]["text"]: b["element"]["type"] for b in view["blocks"] if b["type"] == "input"
    }
    assert kinds == {
        "room": "plain_text_input",
        "notes": "plain_text_input",
        "seats": "number_input",
        "budget": "number_input",
        "catering": "checkboxes",
        "floor": "static_select",
        "guests (JSON)": "plain_text_input",
        "extra (JSON)": "plain_text_input",
    }
    assert len(json.dumps(view)) < 250_000


def test_the_prefilled_modal_submitted_as_is_gives_back_the_proposal() -> None:
    view = edit_modal_for(PROPOSED)
    values = {}
    for block in view["blocks"]:
        if block["type"] != "input":
            continue
        element = block["element"]
        state: dict[str, Any] = {"type": element["type"], "value": element.get("initial_value")}
        if element["type"] == "static_select":
            state = {"selected_option": element.get("initial_option")}
        if element["type"] == "checkboxes":
            state = {"selected_options": element.get("initial_options", [])}
        values[block["block_id"]] = {"v": state}
    args, errors = read_edit(TOOL, PROPOSED, values)
    assert errors == {} and args == PROPOSED


def edit_modal_for(args: dict[str, Any]) -> dict[str, Any]:
    from approvals import ApprovalRequest

    request = ApprovalRequest(
        id="ap_" + "0" * 20,
        run_id="r",
        call_id="c",
        tool=TOOL.name,
        args=args,
        requester="UALICE",
        team_id="T1",
        channel_id="C1",
        policy_version="v",
        binding="b",
        created_at=0.0,
        expires_at=1.0,
    )
    return edit_modal(request, TOOL, "{}", high_risk=False)


def test_a_schema_with_references_is_checked_whole_and_names_the_field() -> None:
    """Checking one argument against a fragment of the schema broke a `$ref` to a sibling
    (an uncaught error before the modal's answer); the whole schema is checked instead."""
    registry = ToolRegistry()
    tool = register_tool(
        name="ref_tool",
        description="Uses a $ref.",
        effect="write",
        parameters={
            "type": "object",
            "properties": {"a": {"type": "string"}, "b": {"$ref": "#/properties/a"}},
            "required": ["a"],
        },
        handler=lambda ctx, args: "ok",
        registry=registry,
    )
    policy = Policy.default(registry)
    assert check_edit(tool, policy, frozenset({"everyone"}), {"a": "x", "b": "y"}) == {
        "a": "x",
        "b": "y",
    }
    with pytest.raises(EditRefused) as refused:
        check_edit(tool, policy, frozenset({"everyone"}), {"a": "x", "b": 3})
    assert refused.value.field == "b"
    with pytest.raises(EditRefused) as refused:
        check_edit(tool, policy, frozenset({"everyone"}), {"b": "y"})
    assert refused.value.field == "a"
