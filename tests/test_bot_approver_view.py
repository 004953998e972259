"""Issue 15, items 6 and 7: what an approver sees is what runs.

- The same high-risk confirmation wherever an Approve button appears (before: App Home's
  Approve skipped it).
- Every argument can be read in full (Show all), even when indented JSON would not fit in
  a modal (before: cut, with a note about an "answer").
- Bidirectional control characters are written out (`\\u202e`) and flagged on the card and
  in Show all (before: shown raw, so a value could read unlike what runs).
- A link in an answer whose label names another address than it opens shows its target
  (before: [https://bank.example](https://evil.example) read "https://bank.example").

End to end over HTTP with FakeSlack and FakeOpenAI; the renderers are property-tested last.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from bot.render import messages as m
from bot.render.blocks import APPROVE, HOME_PAGE, SHOW_ARGS, VIEW_RUN
from bot.render.mrkdwn import BIDI_CONTROLS, code, code_block, has_bidi, neutralise_bidi, to_mrkdwn
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.fakes.slack_server import app_mention, block_actions
from tests.support.slack_bot import (
    ALICE,
    CHANNEL,
    SUPPORT,
    BotEnv,
    bot_env,
    buttons,
    card_of,
    texts,
)

PURE = settings(max_examples=300, deadline=None)
RISKY_POLICY = """\
roles:
  admins: [UADMIN]
  support: ["@support-team"]
admins: [admins]
tools:
  create_ticket:
    allow: [everyone]
    approvers: [support]
    high_risk: true
defaults:
  read: {allow: [everyone]}
"""


def approve_buttons(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        element
        for block in blocks
        for element in block.get("elements") or []
        if element.get("action_id") == APPROVE
    ]


def home_of(env: BotEnv, user: str) -> dict[str, Any]:
    before = len(env.slack.calls("views.publish"))
    env.event({"type": "app_home_opened", "user": user, "tab": "home", "channel": "D0HOME"})
    return env.slack.wait_for(
        lambda: (
            env.slack.calls("views.publish")[before]
            if len(env.slack.calls("views.publish")) > before
            else None
        )
    )["view"]


def opened_modal(env: BotEnv, click: str) -> dict[str, Any]:
    before = len(env.slack.calls("views.open"))
    env.post(click)
    return env.slack.wait_for(
        lambda: (
            env.slack.calls("views.open")[before]
            if len(env.slack.calls("views.open")) > before
            else None
        )
    )["view"]


# -- item 6 --------------------------------------------------------------------------------------


def test_app_home_asks_for_the_same_confirmation_as_the_card(
    redis_conn: redis.Redis, model_server: FakeOpenAI, tmp_path: Path
) -> None:
    model_server.route(
        "VPN", [Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "VPN"})])]
    )
    with bot_env(redis_conn, model_server.url, tmp_path, policy=RISKY_POLICY) as env:
        approval_id, card_ts = card_of(env, app_mention("<@UBOT> file a VPN ticket", user=ALICE))
        [on_card] = approve_buttons(env.slack.message(CHANNEL, card_ts)["blocks"])  # type: ignore[index]
        assert on_card["confirm"]["title"]["text"] == m.CONFIRM_APPROVE_TITLE

        [at_home] = approve_buttons(home_of(env, SUPPORT)["blocks"])
        assert at_home["value"] == approval_id
        assert at_home.get("confirm") == on_card["confirm"]


def test_a_tool_that_is_not_high_risk_asks_nowhere(env: BotEnv, model_server: FakeOpenAI) -> None:
    model_server.route(
        "VPN", [Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "VPN"})])]
    )
    _, card_ts = card_of(env, app_mention("<@UBOT> file a VPN ticket", user=ALICE))
    [on_card] = approve_buttons(env.slack.message(CHANNEL, card_ts)["blocks"])  # type: ignore[index]
    [at_home] = approve_buttons(home_of(env, SUPPORT)["blocks"])
    assert "confirm" not in on_card and "confirm" not in at_home


# -- item 7: every argument, in full ---------------------------------------------------------------


def test_show_all_shows_every_argument_even_when_indenting_would_not_fit(env: BotEnv) -> None:
    """400 levels of nesting: 1 kB as compact JSON, over 300 kB indented."""
    deep: Any = "the innermost value"
    for _ in range(400):
        deep = [deep]
    args = {"project": "IT", "title": "x" * 400, "body": deep, "tags": list(range(50))}
    request = env.rt.approvals.create(
        run_id="r0000000000000001",
        call_id="call_1",
        tool="create_ticket",
        args=args,
        requester=ALICE,
        team_id="T0001",
        channel_id=CHANNEL,
        policy_version=env.rt.policy.version,
        ttl=600,
    )
    modal = opened_modal(env, block_actions(SHOW_ARGS, request.id, ALICE))
    shown = "".join(b["text"]["text"] for b in modal["blocks"][1:]).replace("```", "")
    assert json.loads(shown) == args  # every character of every value


def test_the_card_flags_and_writes_out_bidi_controls_and_show_all_does_too(
    env: BotEnv, model_server: FakeOpenAI
) -> None:
    """ "Refund \u202e001$" reads as "Refund $100" on screen."""
    title = "Refund \u202e001$ to account 42\u2066"
    model_server.route(
        "refund", [Turn(tool_calls=[("create_ticket", {"project": "IT", "title": title})])]
    )
    approval_id, card_ts = card_of(env, app_mention("<@UBOT> file a refund ticket", user=ALICE))
    card = env.slack.message(CHANNEL, card_ts)
    assert card is not None
    shown = texts(card["blocks"])
    assert not has_bidi(shown)
    assert "Refund \\u202e001$ to account 42\\u2066" in shown
    assert m.CARD_BIDI in shown
    assert buttons(card["blocks"])[SHOW_ARGS] == approval_id

    modal = opened_modal(env, block_actions(SHOW_ARGS, approval_id, SUPPORT, message_ts=card_ts))
    in_modal = texts(modal["blocks"])
    assert not has_bidi(in_modal) and m.CARD_BIDI in in_modal
    assert "\\u202e001$" in in_modal


# -- item 7: links show where they go --------------------------------------------------------------


def test_an_answer_link_whose_label_is_another_address_shows_its_target(
    env: BotEnv, model_server: FakeOpenAI
) -> None:
    model_server.route(
        "reset",
        [
            "Reset it at [https://bank.example/login](https://evil.example/steal) "
            "or read [the guide](https://docs.example/reset)."
        ],
    )
    mention = app_mention("<@UBOT> how do I reset my password?", user=ALICE)
    env.event(mention)
    env.wait_for_runs(1)
    env.work()
    answer = env.slack.wait_for_message(
        CHANNEL, lambda msg: VIEW_RUN in buttons(msg.get("blocks") or [])
    )
    shown = texts(answer["blocks"])
    assert "<https://evil.example/steal>" in shown
    assert "bank.example" not in shown
    assert "<https://docs.example/reset|the guide>" in shown


# -- the renderers ---------------------------------------------------------------------------------

bidi = st.sampled_from(list(BIDI_CONTROLS))
mixed = st.lists(st.one_of(st.characters(exclude_characters="\\"), bidi), max_size=60).map("".join)
_WRITTEN_OUT = re.compile(r"\\u(202[a-e]|206[6-9]|200[ef]|061c)")


@PURE
@given(text=mixed)
def test_bidi_controls_are_written_out_and_nothing_else_changes(text: str) -> None:
    out = neutralise_bidi(text)
    assert not has_bidi(out)
    assert _WRITTEN_OUT.sub(lambda found: chr(int(found.group(1), 16)), out) == text
    assert has_bidi(text) == (out != text)
    for shown in (code(text), code_block(text)):
        assert not has_bidi(shown)


hosts = st.sampled_from(
    [
        "bank.example",
        "evil.example",
        "docs.example",
        "www.bank.example",
        "10.0.0.1",
        "bank.example.evil.io",
    ]
)
paths = st.sampled_from(["", "/", "/login", "/steal?x=1", "/a/b#top"])
addresses = st.builds(
    lambda scheme, host, path: f"{scheme}{host}{path}",
    st.sampled_from(["https://", "http://", "", "HTTPS://"]),
    hosts,
    paths,
)
labels = st.lists(
    st.one_of(addresses, st.sampled_from(["the guide", "here", "Section 3.2", "log in at"])),
    min_size=1,
    max_size=3,
).map(" ".join)
targets = st.builds(lambda host, path: f"https://{host}{path}", hosts, paths)
_HOST = re.compile(r"(?i)(?:https?://)?((?:[a-z0-9-]+\.)+[a-z]{2,}|\d+\.\d+\.\d+\.\d+)(/[^\s?#]*)?")


def named_hosts(label: str) -> set[str]:
    return {found.group(1).lower() for found in _HOST.finditer(label)}


@PURE
@example(label="https://bank.example/login", target="https://evil.example/steal")
@example(label="bank.example", target="https://bank.example.evil.io/")
@given(label=labels, target=targets)
def test_a_link_label_never_names_another_host_than_the_link_opens(label: str, target: str) -> None:
    assume("[" not in label and "]" not in label)
    out = to_mrkdwn(f"[{label}]({target})")
    host = (urlsplit(target).hostname or "").lower()
    links = re.findall(r"<([^|>]+)(?:\|([^>]*))?>", out)
    assert [url for url, _ in links] == [target]  # the link opens what the model linked
    [(_, shown)] = links
    if shown:  # a label is kept only when every address it names is the target's host
        assert named_hosts(shown) <= {host}
    if named_hosts(label) - {host}:
        assert out == f"<{target}>"


@PURE
@given(text=st.text(max_size=300))
def test_rendering_any_text_never_raises_and_links_only_to_http(text: str) -> None:
    out = to_mrkdwn(text)
    for url in re.findall(r"<([^|>]+)", out):
        assert url.startswith(("http://", "https://"))


# -- item 3: the App Home's list of what waits for a decision is complete -----------------------


def spam_requests(env: BotEnv, count: int) -> list[str]:
    """`count` pending requests from Mallory, all expiring before a real card's."""
    return [
        env.rt.approvals.create(
            run_id=f"spam{n}",
            call_id=f"call{n}",
            tool="create_ticket",
            args={"project": "IT", "title": f"spam {n}"},
            requester="UMALLORY",
            team_id="T0001",
            channel_id=CHANNEL,
            policy_version=env.rt.policy.version,
            ttl=3600 + n,
        ).id
        for n in range(count)
    ]


def click_in_home(env: BotEnv, home: dict[str, Any], action_id: str, value: str) -> dict[str, Any]:
    """Click a button of the published App Home `home`; the view published next."""
    view = {**home, "id": "VHOME", "type": "home"}
    before = len(env.slack.calls("views.publish"))
    env.post(block_actions(action_id, value, user_id=SUPPORT, view=view))
    return env.slack.wait_for(
        lambda: (
            env.slack.calls("views.publish")[before]
            if len(env.slack.calls("views.publish")) > before
            else None
        )
    )["view"]


def test_a_burst_of_requests_cannot_push_a_real_one_out_of_the_approvers_home(
    env: BotEnv, model_server: FakeOpenAI
) -> None:
    model_server.route(
        "VPN", [Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "VPN"})]), "Filed."]
    )
    real, _ = card_of(env, app_mention("<@UBOT> file a VPN ticket", user=ALICE))
    spam = spam_requests(env, 23)

    home = home_of(env, SUPPORT)
    seen = [b["value"] for b in approve_buttons(home["blocks"])]
    assert seen == spam[:10]  # the soonest to expire first
    assert "1–10 of 24" in texts(home["blocks"])
    assert f"{HOME_PAGE}_previous" not in buttons(home["blocks"])
    pages = 1
    while real not in seen:
        next_page = buttons(home["blocks"])[f"{HOME_PAGE}_next"]
        home = click_in_home(env, home, f"{HOME_PAGE}_next", next_page)
        seen = [b["value"] for b in approve_buttons(home["blocks"])]
        pages += 1
    assert pages == 3 and seen == [*spam[20:], real]
    assert "21–24 of 24" in texts(home["blocks"])
    assert f"{HOME_PAGE}_next" not in buttons(home["blocks"])
    assert buttons(home["blocks"])[f"{HOME_PAGE}_previous"] == "1"

    # deciding from the third page shows the third page again, one shorter
    home = click_in_home(env, home, APPROVE, real)
    assert [b["value"] for b in approve_buttons(home["blocks"])] == spam[20:]
    assert "21–23 of 23" in texts(home["blocks"])


def test_a_home_page_past_the_end_shows_the_last_page(env: BotEnv) -> None:
    spam = spam_requests(env, 12)
    home = click_in_home(env, {"blocks": [], "private_metadata": ""}, f"{HOME_PAGE}_next", "99")
    assert [b["value"] for b in approve_buttons(home["blocks"])] == spam[10:]
    assert json.loads(home["private_metadata"]) == {"page": 1}
