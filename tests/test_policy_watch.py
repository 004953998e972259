"""Live policy in one process: a changed policy file is checked, put in force and recorded;
a broken one is refused in one line and the policy in force stays (worker/policy_watch.py).
The watcher is built by the composition root (`build_runtime`) as every process builds it,
and checked by calling `check()` (its thread does the same every interval)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from switchboard.render import trajectory
from switchboard.settings import Config
from switchboard.wiring import build_runtime
from tests.fakes.openai_server import Turn
from tests.support.runtime import ALICE, work
from tools.builtin.tickets import TicketStore
from worker import runtime as runtime_module
from worker import service
from worker.policy_watch import MAX_POLICY_BYTES, one_line
from worker.run import RunStatus

OPEN = """\
roles:
  admins: [U0ADMIN]
admins: [admins]
defaults:
  read: {allow: [everyone]}
  write: {allow: [everyone], approvers: [requester], self_approval: true}
"""
# knowledge_lookup and create_ticket only for admins: taken away from everyone else
WITHDRAWN = (
    OPEN + "tools:\n  knowledge_lookup: {allow: [admins]}\n  create_ticket: {allow: [admins]}\n"
)
BROKEN = OPEN + "tools:\n  knowledge_lookup: {allow: [admnis]}\n"
LOOKUP = Turn(tool_calls=[("knowledge_lookup", {"name": "Python Basics"})])
CREATE = Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "Printer jam"})])


@pytest.fixture
def configured(monkeypatch, tmp_path, model_server, redis_conn):
    """The environment of a worker with SWITCHBOARD_POLICY set; returns the policy path."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(OPEN)
    for name in list(os.environ):
        if name.startswith(("SWITCHBOARD_", "SLACK_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SWITCHBOARD_POLICY", str(policy))
    monkeypatch.setenv("SWITCHBOARD_TOOLS", "tools.builtin")
    monkeypatch.setenv("SWITCHBOARD_TICKETS_DB", str(tmp_path / "tickets.sqlite3"))
    monkeypatch.setenv("OPENAI_BASE_URL", model_server.url)
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    monkeypatch.setenv("SWITCHBOARD_MODEL", "gpt-fake")
    monkeypatch.chdir(tmp_path)  # no .env here
    return policy


def runtime(redis_conn):
    rt = build_runtime(Config(), redis_conn)
    runtime_module.install(rt)
    assert rt.policy_watcher is not None
    return rt


def offered(request) -> set[str]:
    return {spec["function"]["name"] for spec in request.get("tools", [])}


def test_a_rewritten_policy_withdraws_a_tool_from_the_next_question(
    configured, redis_conn, model_server
):
    rt = runtime(redis_conn)
    before = rt.policy.version
    assert rt.policy_watcher.check() is None  # the file as loaded at start-up: nothing new

    configured.write_text(WITHDRAWN)
    with capture_logs() as logs:
        new = rt.policy_watcher.check()
    assert new is not None and rt.policy is new and new.version != before
    [reloaded] = [e for e in logs if e["event"] == "policy_reloaded"]
    assert (reloaded["version"], reloaded["previous"]) == (new.version, before)

    model_server.route("fee", [LOOKUP, "I may not look that up."])
    run = service.submit(rt, "What is the fee for Python Basics?", ALICE)
    work(rt)
    run = rt.store.load(run.id)
    assert "knowledge_lookup" not in offered(model_server.chat_requests[0])
    assert "calculate" in offered(model_server.chat_requests[0])
    denied = [e for e in rt.events.read(run.id) if e.kind == "tool_denied"]
    assert [e.data["tool"] for e in denied] == ["knowledge_lookup"]
    assert run.policy_version == new.version


def test_a_broken_rewrite_keeps_the_policy_in_force_and_logs_one_line_once(configured, redis_conn):
    rt = runtime(redis_conn)
    before = rt.policy
    configured.write_text(BROKEN)
    with capture_logs() as logs:
        assert rt.policy_watcher.check() is None
        assert rt.policy_watcher.check() is None  # same bad content: not logged again
    assert rt.policy is before
    [refused] = [e for e in logs if e["event"] == "policy_reload_refused"]
    assert "\n" not in refused["error"]
    assert "line 8" in refused["error"] and "unknown role 'admnis'" in refused["error"]
    assert refused["keeping"] == before.version
    assert [e["log_level"] for e in logs if e["event"] == "policy_reload_refused"] == ["error"]

    configured.write_text(WITHDRAWN)  # fixed: taken at the next check
    assert rt.policy_watcher.check() is not None


@pytest.mark.parametrize(
    "content",
    [
        b"\xff\xfe not utf-8",
        b"roles: [unclosed",
        b"tools:\n  nope_tool: {allow: [everyone]}\n",
        b"x" * (MAX_POLICY_BYTES + 1),
    ],
    ids=["not-utf8", "bad-yaml", "unknown-tool", "too-big"],
)
def test_every_kind_of_bad_file_is_refused_in_one_line(configured, redis_conn, content):
    rt = runtime(redis_conn)
    before = rt.policy
    configured.write_bytes(content)
    with capture_logs() as logs:
        assert rt.policy_watcher.check() is None
    assert rt.policy is before
    [refused] = [e for e in logs if e["event"] == "policy_reload_refused"]
    assert "\n" not in refused["error"] and str(configured) in refused["error"]


def test_a_deleted_file_keeps_the_policy_and_its_return_is_picked_up(configured, redis_conn):
    rt = runtime(redis_conn)
    before = rt.policy
    configured.unlink()
    with capture_logs() as logs:
        assert rt.policy_watcher.check() is None
    assert rt.policy is before
    assert any(e["event"] == "policy_reload_refused" for e in logs)
    configured.write_text(WITHDRAWN)
    assert rt.policy_watcher.check() is not None


def configmap(folder: Path, content: str, generation: int) -> None:
    """What the kubelet does to a mounted ConfigMap: the files live in a timestamped folder,
    `..data` links to it, and `policy.yaml` links to `..data/policy.yaml`; an update writes a
    new folder and renames a new `..data` link over the old one (atomic)."""
    data = folder / f"..2026_12_01_00_00_0{generation}"
    data.mkdir()
    (data / "policy.yaml").write_text(content)
    os.utime(data / "policy.yaml", (1_000_000_000, 1_000_000_000))  # the same old mtime
    tmp = folder / "..data_tmp"
    tmp.symlink_to(data.name)
    os.replace(tmp, folder / "..data")
    if not (folder / "policy.yaml").is_symlink():
        (folder / "policy.yaml").symlink_to("..data/policy.yaml")


def test_a_configmap_update_by_symlink_swap_is_picked_up(
    configured, redis_conn, monkeypatch, tmp_path
):
    mount = tmp_path / "config"
    mount.mkdir()
    configmap(mount, OPEN, 1)
    monkeypatch.setenv("SWITCHBOARD_POLICY", str(mount / "policy.yaml"))
    rt = runtime(redis_conn)
    link = os.stat(mount / "policy.yaml", follow_symlinks=False)
    before = rt.policy.version

    configmap(mount, WITHDRAWN, 2)

    assert os.stat(mount / "policy.yaml", follow_symlinks=False).st_mtime == link.st_mtime
    new = rt.policy_watcher.check()
    assert new is not None and new.version != before
    assert new.authorize_caller("knowledge_lookup", frozenset({"everyone"})) is not None


def test_a_change_only_to_limits_is_put_in_force(configured, redis_conn):
    rt = runtime(redis_conn)
    configured.write_text(OPEN + "limits:\n  runs_per_minute: 1\n")
    assert rt.policy_watcher.check() is not None
    assert rt.limits.limits.runs_per_minute == 1
    assert rt.settings.limits.runs_per_minute == 1


def test_a_comment_does_not_count_as_a_new_policy(configured, redis_conn):
    rt = runtime(redis_conn)
    before = rt.policy
    configured.write_text("# reviewed\n" + OPEN)
    with capture_logs() as logs:
        assert rt.policy_watcher.check() is None
    assert rt.policy is before and not [e for e in logs if e["event"] == "policy_reloaded"]


def test_a_run_waiting_across_a_reload_records_the_change_and_its_write_follows_the_new_policy(
    configured, redis_conn, model_server, tmp_path
):
    """What the README promises for an approval asked under the old policy: it stays, is
    decided under the policy in force, and its write runs only if that policy still allows
    the call; the run records the change of policy."""
    rt = runtime(redis_conn)
    model_server.route("Printer", [CREATE, "I could not file it."])
    run = service.submit(rt, "Printer jam, file a ticket", ALICE)
    work(rt)
    run = rt.store.load(run.id)
    assert run.status == RunStatus.AWAITING_APPROVAL
    old = run.policy_version
    assert old == rt.policy.version

    configured.write_text(WITHDRAWN)
    new = rt.policy_watcher.check()
    assert new is not None
    outcome = service.decide(
        rt,
        run.pending_approvals[0],
        decider_id=ALICE.user_id,
        decider_roles=frozenset(ALICE.roles),
        approve=True,
    )
    assert outcome.result == service.DecisionResult.DECIDED
    work(rt)

    run = rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED
    assert TicketStore(tmp_path / "tickets.sqlite3").count_executions("create_ticket") == 0
    observations = [m["content"] for m in run.messages if m.get("role") == "tool"]
    assert observations and observations[0].startswith("Not run:")
    [changed] = [e for e in rt.events.read(run.id) if e.kind == "policy_changed"]
    assert (changed.data["before"], changed.data["after"]) == (old, new.version)
    assert run.policy_version == new.version
    shown = trajectory(run, rt.events.read(run.id))  # `switchboard runs show`
    assert f"Policy: {new.version}" in shown and "policy changed" in shown


def test_a_changed_mcp_file_is_logged_as_needing_a_restart(
    configured, redis_conn, monkeypatch, tmp_path
):
    from switchboard.wiring import watch_policy
    from worker.limits import Limits

    rt = runtime(redis_conn)
    mcp = tmp_path / "mcp.yaml"
    mcp.write_text("servers:\n  time: {command: mcp-server-time}\n")
    monkeypatch.setenv("SWITCHBOARD_MCP", str(mcp))  # (not connected: the watch is tested)
    watcher = watch_policy(Config(), rt, None, Limits())
    assert watcher is not None
    mcp.write_text("servers:\n  git: {command: mcp-server-git}\n")
    with capture_logs() as logs:
        watcher.check()
        watcher.check()
    [changed] = [e for e in logs if e["event"] == "mcp_config_changed"]
    assert "restart" in changed["action"] and changed["log_level"] == "warning"


def test_one_line_names_the_first_problem_and_counts_the_rest():
    assert one_line("a.yaml line 2: x\na.yaml line 5: y\n") == (
        "a.yaml line 2: x (and 1 more; `switchboard tools check` lists them)"
    )
    assert one_line("only one") == "only one"


def test_the_slack_bot_takes_roles_from_a_reloaded_policy(env, model_server):
    """The bot's identity (Slack user -> roles) follows the policy put in force: removed from
    the admins role, UADMIN no longer lists everyone's runs."""
    from tests.support.runtime import requester
    from tests.support.slack_bot import ADMIN, CHANNEL, POLICY, answered, texts
    from tools.policy import Policy
    from tools.registry import registry

    def listing(user: str) -> str:
        shown = answered(env, "chat.postEphemeral", lambda: env.command("runs all", user))
        assert shown["channel"] == CHANNEL
        return texts(shown["blocks"])

    model_server.route("salary", ["I cannot see salaries."])
    bobs = service.submit(env.rt, "Bob's salary question", requester(env.rt, "UBOB"))
    env.work()
    assert bobs.id in listing(ADMIN)

    demoted = POLICY.replace("admins: [UADMIN]", "admins: [UOTHER]")
    env.rt.use_policy(Policy.parse(demoted, registry, source="policy.yaml"))

    shown = listing(ADMIN)
    assert bobs.id not in shown and "Only admins" in shown


def test_the_policy_read_at_start_up_is_not_parsed_again(configured, redis_conn):
    rt = runtime(redis_conn)
    with capture_logs() as logs:
        assert rt.policy_watcher.check() is None
    assert [e for e in logs if e["event"] == "policy_loaded"] == []
