"""`switchboard approvals` and `runs cancel`: what was left open is decided from the shell."""

from __future__ import annotations

import pytest

from switchboard.cli import main
from switchboard.console import local_user
from tests.fakes.openai_server import Turn
from tests.support.runtime import event_kinds, make_runtime, tool_messages, work
from tools.builtin.tickets import TicketStore
from worker import service
from worker.run import Requester, RunStatus
from worker.service import grants

CREATE = Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "Printer jam"})])


@pytest.fixture
def shell(monkeypatch, redis_url, model_server, tmp_path):
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("OPENAI_BASE_URL", model_server.url)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("SWITCHBOARD_TICKETS_DB", str(tmp_path / "tickets.sqlite3"))
    for name in ("SWITCHBOARD_POLICY", "SWITCHBOARD_TOOLS", "SWITCHBOARD_MCP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def waiting_run(rt, question: str):
    """A run asked in the console, left waiting for its approval."""
    me = Requester(user_id=local_user(), roles=["everyone"])
    run = service.submit(rt, question, me, origin={"surface": "console"})
    work(rt)
    run = rt.store.load(run.id)
    assert run.status == RunStatus.AWAITING_APPROVAL
    return run, run.pending_approvals[0]


def test_an_approval_left_in_the_console_is_listed_shown_and_approved_from_the_shell(
    shell, redis_conn, model_server, tmp_path, capsys
):
    model_server.route("Printer", [CREATE, "Filed ticket #1 for the printer."])
    rt = make_runtime(redis_conn, model_server.url)
    run, approval = waiting_run(rt, "Printer jam on floor 2, file it")

    assert main(["approvals", "list"]) == 0
    listed = capsys.readouterr().out
    assert approval in listed and "create_ticket" in listed and local_user() in listed

    assert main(["approvals", "show", approval]) == 0
    shown = capsys.readouterr().out
    assert '"title": "Printer jam"' in shown and "May decide: the requester" in shown

    assert main(["approvals", "approve", approval, "--user", "USOMEONE"]) == 2
    refused = capsys.readouterr().err.strip()
    assert refused.count("\n") == 0 and "USOMEONE may not decide" in refused
    assert "the requester" in refused and "--user" in refused

    assert main(["approvals", "approve", approval]) == 0
    assert f"approved by {local_user()}" in capsys.readouterr().out
    work(rt)
    run = rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED and run.answer == "Filed ticket #1 for the printer."
    assert TicketStore(tmp_path / "tickets.sqlite3").count_executions("create_ticket") == 1

    assert main(["approvals", "approve", approval]) == 1
    assert "already approved" in capsys.readouterr().out
    assert main(["approvals", "list"]) == 0
    assert "no approvals waiting" in capsys.readouterr().out


def test_a_rejection_from_the_shell_carries_its_reason_to_the_model(
    shell, redis_conn, model_server, capsys
):
    model_server.route("Printer", [CREATE, "OK, I did not file it."])
    rt = make_runtime(redis_conn, model_server.url)
    run, approval = waiting_run(rt, "Printer jam again, file it")
    assert main(["approvals", "reject", approval, "--reason", "already reported"]) == 0
    work(rt)
    run = rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED
    tool_results = [m["content"] for m in run.messages if m.get("role") == "tool"]
    assert any("already reported" in text for text in tool_results)
    assert main(["approvals", "show", approval]) == 0
    assert f"Decided by {local_user()}" in capsys.readouterr().out


def test_an_unknown_approval_is_one_line(shell, capsys):
    assert main(["approvals", "approve", "ap_nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("switchboard: no approval 'ap_nope'") and "\n" not in err


def test_the_local_operator_may_cancel_any_run_without_a_policy_file(
    shell, redis_conn, model_server, capsys
):
    model_server.route("Printer", [CREATE, "never"])
    rt = make_runtime(redis_conn, model_server.url)
    someone = Requester(user_id="U0SOMEONE", roles=["everyone"])
    run = service.submit(rt, "Printer jam, file it", someone)
    work(rt)
    assert main(["runs", "cancel", run.id]) == 0
    assert f"{run.id}: cancelling" in capsys.readouterr().out
    work(rt)
    run = rt.store.load(run.id)
    assert run.status == RunStatus.PARTIAL and run.reason and run.reason.value == "cancelled"
    assert "cancel_requested" in event_kinds(rt, run)


def test_an_approval_from_the_shell_with_no_worker_alive_says_the_run_waits_for_one(
    shell, redis_conn, model_server, capsys
):
    model_server.route("Printer", [CREATE, "Filed it."])
    rt = make_runtime(redis_conn, model_server.url)
    run, approval = waiting_run(rt, "Printer jam in the lobby, file it")
    capsys.readouterr()

    assert main(["approvals", "approve", approval]) == 0
    said = capsys.readouterr().out
    assert f"run {run.id} waits for a worker: none is alive" in said, said
    assert "goes on" not in said.split(";")[1].split("(")[0]
    assert rt.store.load(run.id).status == RunStatus.AWAITING_APPROVAL  # nothing ran it


@pytest.mark.slow
def test_an_approval_from_the_shell_with_a_worker_alive_says_the_run_goes_on(
    shell, redis_conn, redis_url, model_server, tmp_path, capsys
):
    from switchboard.supervise import live_workers
    from tests.support.processes import WorkerProcess, worker_env
    from tests.support.runtime import wait_for_run, wait_until

    model_server.route("Printer", [CREATE, "Filed it."])
    rt = make_runtime(redis_conn, model_server.url)
    run, approval = waiting_run(rt, "Printer jam upstairs, file it")
    env = worker_env(redis_url, model_server.url, tmp_path)
    worker = WorkerProcess(env, tmp_path / "worker.log")
    try:
        wait_until(lambda: live_workers(rt.queue), timeout=30, what="the worker to register")
        capsys.readouterr()
        assert main(["approvals", "approve", approval]) == 0
        said = capsys.readouterr().out
        assert f"run {run.id} goes on" in said and "waits for a worker" not in said, said
        assert wait_for_run(rt, run.id, timeout=30).status == RunStatus.COMPLETED
    finally:
        worker.stop()


GRANT_POLICY = """\
tools:
  create_ticket:
    allow: [everyone]
    approvers: [requester]
    self_approval: true
    grants: [hour]
    self_grants: true
defaults:
  read: {allow: [everyone]}
"""


def test_standing_grants_are_listed_shown_in_runs_show_and_revoked_from_the_shell(
    shell, monkeypatch, redis_conn, model_server, tmp_path, capsys
):
    policy = tmp_path / "policy.yaml"
    policy.write_text(GRANT_POLICY)
    monkeypatch.setenv("SWITCHBOARD_POLICY", str(policy))
    second = Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "Toner out"})])
    model_server.route("Printer", [CREATE, "Filed."])
    model_server.route("Toner", [second, "Filed that too."])
    rt = make_runtime(redis_conn, model_server.url, policy_file=policy)
    _, approval = waiting_run(rt, "Printer jam on floor 2, file it")
    me = local_user()
    made = grants.approve_and_allow(
        rt,
        approval,
        scope="hour",
        widened={"title"},
        decider_id=me,
        decider_roles=frozenset({"everyone"}),
        surface="cli",
    )
    assert made.result == grants.GrantResult.GRANTED and made.grant is not None
    work(rt)
    run = service.submit(
        rt,
        "Toner is out, file it",
        Requester(user_id=me, roles=["everyone"]),
        origin={"surface": "console"},
    )
    work(rt)
    assert rt.store.load(run.id).status == RunStatus.COMPLETED  # no approval asked

    assert main(["approvals", "grants", "list"]) == 0
    listed = capsys.readouterr().out
    assert made.grant.id in listed and "create_ticket" in listed and "used 1" in listed
    assert 'project="IT"' in listed and "any title" in listed
    assert main(["runs", "show", run.id]) == 0
    shown = capsys.readouterr().out
    assert f"approved by grant {made.grant.id} of {me}" in shown
    assert f"Grants used:\n  {made.grant.id} (granted by {me}): 1 call(s)" in shown

    assert main(["approvals", "grants", "revoke", made.grant.id, "--user", "USOMEONE"]) == 2
    assert "USOMEONE may not revoke" in capsys.readouterr().err
    assert main(["approvals", "grants", "revoke", made.grant.id]) == 0
    assert "revoked" in capsys.readouterr().out
    assert main(["approvals", "grants", "list"]) == 0
    assert "no standing grants" in capsys.readouterr().out
    assert "grant_revoked" in event_kinds(rt, rt.store.load(made.grant.run_id))


def test_approve_with_set_runs_the_edited_call_and_refuses_what_the_schema_does_not_allow(
    shell, redis_conn, model_server, tmp_path, capsys
):
    model_server.route("Printer", [CREATE, "Filed it, as edited."])
    rt = make_runtime(redis_conn, model_server.url)
    run, approval = waiting_run(rt, "Printer jam on floor 2, file it")
    for bad, says in (
        (["--set", "nope=1"], "there is no argument 'nope'"),
        (["--set", "priority=banana"], "the edit is refused (priority)"),
        (["--set", "title"], "is not field=value"),
    ):
        assert main(["approvals", "approve", approval, *bad]) == 2
        assert says in capsys.readouterr().err
    assert not rt.approvals.get(approval).decided

    edit = ["--set", "title=Printer on fire = urgent", "--set", "priority=urgent"]
    assert main(["approvals", "approve", approval, *edit]) == 0
    assert f"approved with edits by {local_user()}" in capsys.readouterr().out
    work(rt)
    assert rt.store.load(run.id).status == RunStatus.COMPLETED
    ticket = TicketStore(tmp_path / "tickets.sqlite3").get(1)
    assert ticket is not None and ticket["title"] == "Printer on fire = urgent"
    assert ticket["priority"] == "urgent"


def test_reject_with_instructions_tells_the_model_what_to_do_instead(
    shell, redis_conn, model_server, capsys
):
    model_server.route("Printer", [CREATE, "I will ask facilities instead."])
    rt = make_runtime(redis_conn, model_server.url)
    run, approval = waiting_run(rt, "Printer jam again, file it")
    told = ["--instructions", "ask facilities, they own printers", "--reason", "wrong team"]
    assert main(["approvals", "reject", approval, *told]) == 0
    work(rt)
    assert rt.store.load(run.id).status == RunStatus.COMPLETED
    [observation] = tool_messages(model_server.last_chat_request)
    assert "wrong team" in observation and "ask facilities, they own printers" in observation
