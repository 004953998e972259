"""Standing grants end to end: signed clicks and modal submissions to the real Bolt app,
FakeSlack as the Web API, FakeOpenAI for the model, the real loop on RQ's SimpleWorker and
a real Redis. One grant lets similar writes in the thread run without cards, each recorded
as approved by its grantor; anything outside it, or after it lapsed, gets a card."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from bot.render.blocks import APPROVE
from bot.render.grants import GRANT_MODAL, REVOKE_GRANT, WIDEN_BLOCK, WIDEN_INPUT, grant_action
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.fakes.slack_server import view_submission
from tests.support.grants import (
    FILED,
    NOTE_SCHEMA,
    POLICY,
    ask,
    card_for,
    cards,
    declare_note,
    grant_thread,
    note,
    open_grant,
    submit_grant,
    to_user,
)
from tests.support.slack_bot import (
    ADMIN,
    ALICE,
    CHANNEL,
    STRANGER,
    SUPPORT,
    SUPPORT2,
    USERGROUPS,
    BotEnv,
    bot_env,
    buttons,
    texts,
)
from tools.policy import Policy
from tools.registry import registry
from worker import metrics
from worker.events import EventKind
from worker.run import RunStatus
from worker.service import grants


@pytest.fixture
def env(
    redis_conn: redis.Redis, model_server: FakeOpenAI, tickets_db: Path, tmp_path: Path
) -> Iterator[BotEnv]:
    FILED.clear()
    declare_note(NOTE_SCHEMA)
    try:
        with bot_env(redis_conn, model_server.url, tmp_path, policy=POLICY) as bot:
            yield bot
    finally:
        registry.unregister("file_note")


def covered_events(env: BotEnv) -> list[Any]:
    return [
        e
        for run in env.runs()
        for e in env.rt.events.read(run.id)
        if e.kind == EventKind.APPROVAL_COVERED
    ]


def test_one_grant_runs_four_similar_writes_without_cards_and_the_sixth_gets_one(
    env: BotEnv, model_server: FakeOpenAI
) -> None:
    model_server.route(
        "close out",
        [*(note(f"n{i}") for i in range(1, 6)), note("n6", project="HR"), "Filed all six."],
    )
    covered_before = metrics.GRANT_COVERED._value.get()
    mention = ask(env, "close out the notes")
    approval_id, card_ts, card = card_for(env, 1)
    offered = buttons(card["blocks"])
    assert offered[grant_action("thread")] == offered[grant_action("hour")] == approval_id
    assert grant_action("day") not in offered  # only what the policy allows

    view = open_grant(env, approval_id, card_ts, mention["ts"], "thread", SUPPORT)
    assert view is not None
    shown = texts(view["blocks"])
    assert "in this thread" in shown and '`"IT"`' in shown and "title" in shown
    assert submit_grant(env, view, SUPPORT, ["title"], ["project", "title"]) is None
    env.work()

    sixth, _, _ = card_for(env, 2)  # outside the constraint: project HR
    assert len(cards(env)) == 2
    assert env.rt.approvals.get(sixth).args == {"project": "HR", "title": "n6"}
    assert [f["title"] for f in FILED] == ["n1", "n2", "n3", "n4", "n5"]  # each once
    [grant] = grants.allowed_for(env.rt, ALICE)
    assert (grant.grantor, grant.scope, grant.uses) == (SUPPORT, "thread", 4)
    assert grant.constraint.fixed == {"project": "IT"} and grant.constraint.any == ("title",)
    covered = covered_events(env)
    assert [e.data["by"] for e in covered] == [SUPPORT] * 4
    for event in covered:  # each recorded as an approval, decided by the grant's grantor
        approval = env.rt.approvals.get(event.data["approval_id"])
        assert (approval.status.value, approval.decided_by) == ("approved", SUPPORT)
        assert approval.grant_id == grant.id
    lines = [m for m in env.slack.thread(CHANNEL, mention["ts"]) if "standing grant" in texts(m)]
    assert len(lines) == 4 and all(APPROVE not in buttons(m.get("blocks", [])) for m in lines)
    assert metrics.GRANT_COVERED._value.get() - covered_before == 4

    env.click(APPROVE, sixth, SUPPORT, channel=CHANNEL, thread_ts=mention["ts"])
    env.work()
    [run] = env.runs()
    assert env.rt.store.load(run.id).status == RunStatus.COMPLETED
    assert len(FILED) == 6


def test_revocation_expiry_a_policy_change_and_a_schema_change_each_end_the_grant(
    env: BotEnv, model_server: FakeOpenAI
) -> None:
    words = ["first", "second", "third", "fourth", "fifth"]
    model_server.route("first", [note("a"), note("b"), "ok"])
    for word in words[1:]:
        model_server.route(word, [note(word), "ok"])
    mention = ask(env, "first notes")
    thread = mention["ts"]
    grant_thread(env, *card_for(env, 1)[:2], thread)
    assert [f["title"] for f in FILED] == ["a", "b"] and len(cards(env)) == 1  # b: covered

    def lapses_then_asks(word: str, count: int) -> None:
        ask(env, f"{word} note", thread_ts=thread)
        approval_id, card_ts, _ = card_for(env, count)  # the next call gets a card
        assert FILED[-1]["title"] != word
        grant_thread(env, approval_id, card_ts, thread)  # approve it and grant again
        assert FILED[-1]["title"] == word

    [grant] = grants.allowed_for(env.rt, ALICE)
    env.event({"type": "app_home_opened", "user": ALICE, "tab": "home", "channel": "D0001"})
    shown = env.slack.wait_for_call("views.publish", lambda a: a["user_id"] == ALICE)["view"]
    assert "Allowed for you" in texts(shown["blocks"]) and "any title" in texts(shown["blocks"])
    assert buttons(shown["blocks"])[REVOKE_GRANT] == grant.id
    home = {"id": "VHOME00001", "type": "home", "private_metadata": "{}"}
    env.click(REVOKE_GRANT, grant.id, STRANGER, view=home)  # not theirs to revoke
    env.slack.wait_for_call("views.open", lambda a: "Only the grantor" in texts(a["view"]))
    still = grants.find(env.rt, grant.id)
    assert still is not None and not still.revoked
    env.click(REVOKE_GRANT, grant.id, SUPPORT, view=home)
    after = env.slack.wait_for_call("views.publish", lambda a: a["user_id"] == SUPPORT)["view"]
    assert "No standing grants" in texts(after["blocks"])
    assert grants.find(env.rt, grant.id).revoked_by == SUPPORT  # type: ignore[union-attr]
    lapses_then_asks("second", 2)

    [grant] = grants.allowed_for(env.rt, ALICE)
    seconds, _ = env.rt.redis.time()  # its day is up, by Redis's clock
    env.rt.redis.hset(env.rt.grants.keys.grant(grant.id), "expires_at", seconds - 1)
    lapses_then_asks("third", 3)

    env.rt.use_policy(Policy.parse(POLICY + "  # reloaded\n", registry))  # same rules
    assert len(grants.allowed_for(env.rt, ALICE)) == 1
    changed = POLICY.replace("admins: [UADMIN]", "admins: [UADMIN, UADMIN2]")
    env.rt.use_policy(Policy.parse(changed, registry))
    lapses_then_asks("fourth", 4)

    declare_note({**NOTE_SCHEMA, "properties": {**NOTE_SCHEMA["properties"], "tag": {}}})
    lapses_then_asks("fifth", 5)
    assert len(covered_events(env)) == 1  # only b, before the first lapse


def test_a_grant_covers_nothing_while_its_grantor_is_out_of_the_approvers_group(
    redis_conn: redis.Redis, model_server: FakeOpenAI, tickets_db: Path, tmp_path: Path
) -> None:
    """A grant approves in its grantor's name: it stops when they could no longer approve the
    call themselves (their Slack user group, read again at every use). Not revoked: it
    covers calls again once they are put back."""
    FILED.clear()
    declare_note(NOTE_SCHEMA)
    model_server.route("first", [note("a"), note("b"), "ok"])
    for word in ("second", "third"):
        model_server.route(word, [note(word), "ok"])
    [group] = USERGROUPS
    lapsed = metrics.GRANT_LAPSED.labels("grantor_roles")._value.get()
    try:
        with bot_env(redis_conn, model_server.url, tmp_path, policy=POLICY, groups_ttl=0) as env:
            thread = ask(env, "first notes")["ts"]
            grant_thread(env, *card_for(env, 1)[:2], thread)
            assert [f["title"] for f in FILED] == ["a", "b"] and len(cards(env)) == 1

            env.slack.add_usergroup(group["id"], group["handle"], [SUPPORT2])  # SUPPORT left
            ask(env, "second note", thread_ts=thread)
            approval_id, card_ts, _ = card_for(env, 2)  # a card, not the grant
            assert [f["title"] for f in FILED] == ["a", "b"]
            assert metrics.GRANT_LAPSED.labels("grantor_roles")._value.get() == lapsed + 1
            [grant] = grants.allowed_for(env.rt, ALICE)
            assert not grant.revoked and grant.uses == 1
            env.click(APPROVE, approval_id, SUPPORT2, channel=CHANNEL, message_ts=card_ts)
            env.work()
            assert FILED[-1]["title"] == "second"

            env.slack.add_usergroup(group["id"], group["handle"], group["users"])  # back
            ask(env, "third note", thread_ts=thread)
            assert FILED[-1]["title"] == "third" and len(cards(env)) == 2  # covered again
            [grant] = grants.allowed_for(env.rt, ALICE)
            assert grant.uses == 2
    finally:
        registry.unregister("file_note")


def test_grants_are_refused_to_non_approvers_high_risk_tools_forged_and_replayed_actions(
    env: BotEnv, model_server: FakeOpenAI
) -> None:
    model_server.route("note", [note("x"), "ok"])
    model_server.route(
        "ticket",
        [Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "VPN"})]), "ok"],
    )
    mention = ask(env, "a note please")
    approval_id, card_ts, _ = card_for(env, 1)
    for user in (STRANGER, ALICE):  # not an approver; the requester without self-approval
        assert open_grant(env, approval_id, card_ts, mention["ts"], "thread", user) is None
        refusal = env.slack.wait_for_call("chat.postEphemeral", to_user(user))
        assert "@support" in refusal["text"]

    view = open_grant(env, approval_id, card_ts, mention["ts"], "thread", SUPPORT)
    assert view is not None
    meta = json.loads(view["private_metadata"])
    forged_scope = {**view, "private_metadata": json.dumps({**meta, "scope": "day"})}
    for forged, user in (
        (view, STRANGER),  # someone else submits the approver's modal
        (forged_scope, SUPPORT),  # a scope the policy does not offer
    ):
        answer = submit_grant(env, forged, user, [], ["project", "title"])
        assert answer["response_action"] == "errors"
    bad_option = view_submission(
        GRANT_MODAL,
        {f"{WIDEN_BLOCK}0": {WIDEN_INPUT: {"selected_options": [{"value": "0:7"}]}}},
        user_id=SUPPORT,
        private_metadata=view["private_metadata"],
    )
    assert "errors" in env.post(bad_option).body
    assert not env.rt.approvals.get(approval_id).decided and grants.live(env.rt) == []

    assert submit_grant(env, view, SUPPORT, [], ["project", "title"]) is None
    replayed = submit_grant(env, view, SUPPORT, ["title"], ["project", "title"])
    assert replayed["response_action"] == "errors" and "Approved" in json.dumps(replayed)
    assert len(grants.live(env.rt)) == 1
    env.work()

    ask(env, "a ticket please")
    ticket, ticket_ts, card = card_for(env, 2)
    assert not any(a.startswith("sb_grant") for a in buttons(card["blocks"]))  # high_risk
    assert open_grant(env, ticket, ticket_ts, mention["ts"], "thread", SUPPORT) is None
    assert grants.live(env.rt)[0].tool == "file_note"
    admin_roles = env.rt.policy.roles_for(ADMIN)
    [grant] = grants.live(env.rt)
    assert grants.revoke(env.rt, grant.id, by=STRANGER, roles=frozenset({"everyone"})) == (
        grants.RevokeResult.NOT_ALLOWED
    )
    assert grants.revoke(env.rt, grant.id, by=ADMIN, roles=admin_roles) == (
        grants.RevokeResult.REVOKED
    )
