"""worker/redact.py: credentials out of logs and spans, whatever text they are hidden in."""

from __future__ import annotations

import string

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bot.transport.payloads import KIND, request_kind
from worker.redact import REDACTED, redact_text, redact_value

ALNUM = string.ascii_letters + string.digits
tokens = st.one_of(
    st.builds(lambda s: "xoxb-" + s, st.text(ALNUM + "-", min_size=10, max_size=60)),
    st.builds(lambda s: "xapp-1-" + s, st.text(ALNUM, min_size=10, max_size=60)),
    st.builds(lambda s: "xoxe.xoxp-1-" + s, st.text(ALNUM, min_size=10, max_size=60)),
    st.builds(lambda s: "sk-" + s, st.text(ALNUM + "_-", min_size=20, max_size=60)),
    st.builds(lambda s: "Bearer " + s, st.text(ALNUM + "._-", min_size=12, max_size=60)),
)
around = st.text(string.printable.replace("-", ""), max_size=40).map(lambda t: t + " ")
QUICK = settings(max_examples=60, deadline=None)  # pure functions: the suite's time is short


@QUICK
@given(before=around, token=tokens, after=around)
def test_a_token_shaped_value_is_redacted_wherever_it_stands(before, token, after):
    secret = token.split(" ")[-1]
    assume(secret not in before + after)
    shown = redact_text(before + token + " " + after)
    assert secret not in shown and REDACTED in shown


@QUICK
@given(text=st.text(max_size=300), known=st.text(ALNUM, min_size=6, max_size=30))
def test_a_known_secret_never_survives_and_redaction_is_stable(text, known):
    shown = redact_text(text + known + text, known=(known,))
    assert known not in shown
    assert redact_text(shown, known=(known,)) == shown


@QUICK
@given(
    value=st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=30)),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
        ),
        max_leaves=30,
    )
)
def test_any_json_value_keeps_its_shape_and_loses_secret_named_fields(value):
    shown = redact_value({"api_key": value, "SlackToken": "x", "data": value})
    assert shown["api_key"] == REDACTED and shown["SlackToken"] == REDACTED
    assert type(shown["data"]) is (list if isinstance(value, tuple) else type(value))


def test_a_value_nested_past_the_bound_is_cut_not_walked():
    deep: object = "xoxb-123456789-abcdefghij"
    for _ in range(100):
        deep = [deep]
    assert "xoxb" not in str(redact_value(deep))


def test_credentials_in_urls_and_assignments_go_but_prose_stays():
    assert redact_text("redis://user:hunter22@redis:6379/0") == "redis://[redacted]@redis:6379/0"
    assert redact_text("password=hunter22 ok") == "password=[redacted] ok"
    plain = "The fee is INR 2999; basic prerequisites: Python Basics (token of thanks)."
    assert redact_text(plain) == plain


names = st.sampled_from(["event_callback", "block_actions", "app_mention", "Bad Type", "a" * 41])
scalars = st.one_of(st.none(), st.integers(), st.text(max_size=60), names)


@QUICK
@given(
    body=st.dictionaries(
        st.sampled_from(["type", "event", "command", "x"]),
        scalars | st.dictionaries(st.sampled_from(["type", "x"]), scalars, max_size=2),
        max_size=4,
    )
)
def test_a_request_kind_is_always_one_of_a_few_short_names(body):
    kind = request_kind(body)
    assert kind == "unknown" or all(KIND.fullmatch(part) for part in kind.split(" "))
    assert len(kind) <= 81
