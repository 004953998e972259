"""Building a real runtime for tests: real Redis, real RQ, the real openai client."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

import redis

import tools.builtin
from switchboard.settings import Config
from tools.policy import Policy
from tools.registry import registry
from worker import runtime as runtime_module
from worker import service
from worker.model import ModelClient
from worker.process import make_worker
from worker.run import Budgets, Requester, Run, RunStatus
from worker.runtime import Runtime, Settings
from worker.surface import Surface

T = TypeVar("T")

ALICE = Requester(user_id="UALICE", team_id="T0001", channel_id="C0001", roles=["everyone"])


def make_runtime(
    conn: redis.Redis,
    model_url: str,
    *,
    policy_file: Path | None = None,
    budgets: Budgets | None = None,
    model: str = "gpt-fake",
    surfaces: dict[str, Surface] | None = None,
    model_timeout: float = 10.0,
    model_retries: int = 2,
    **settings: Any,
) -> Runtime:
    tools.builtin.load()
    policy = Policy.load(policy_file, registry) if policy_file else Policy.default(registry)
    rt = Runtime(
        redis=conn,
        registry=registry,
        policy=policy,
        model=ModelClient(
            model=model,
            api_key="test",
            base_url=model_url,
            timeout=model_timeout,
            max_retries=model_retries,
        ),
        settings=Settings(
            budgets=budgets or Budgets(),
            model_timeout=model_timeout,
            model_retries=model_retries,
            tool_settings=Config().tool_settings,  # as a process would (tickets_db fixture)
            **settings,
        ),
        surfaces=dict(surfaces or {}),
    )
    runtime_module.install(rt)
    return rt


class KeptText:
    """A TextSink that keeps the streamed answer text, as a surface would show it."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def text(self, delta: str) -> None:
        self.parts.append(delta)

    def reset(self) -> None:
        self.parts.clear()


def requester(rt: Runtime, user_id: str, groups: tuple[str, ...] = ()) -> Requester:
    return Requester(
        user_id=user_id,
        team_id="T0001",
        channel_id="C0001",
        roles=sorted(rt.policy.roles_for(user_id, groups)),
    )


def approve_first(rt: Runtime, run_id: str, user: Requester = ALICE) -> None:
    """Approve the run's first pending request as `user`, who must be allowed to."""
    run = rt.store.load(run_id)
    outcome = service.decide(
        rt,
        run.pending_approvals[0],
        decider_id=user.user_id,
        decider_roles=frozenset(user.roles),
        approve=True,
    )
    assert outcome.result == service.DecisionResult.DECIDED, outcome


def work(rt: Runtime) -> None:
    """Run queued jobs in this process until the queue is empty (RQ's SimpleWorker, burst)."""
    runtime_module.install(rt)
    make_worker(rt).work(burst=True, logging_level="WARNING")


def wait_until(
    predicate: Callable[[], T | Literal[False] | None], timeout: float = 15.0, what: str = ""
) -> T:
    """Poll observable state until `predicate` is truthy; returns what it returned then
    (so `lambda: cond and value` yields `value`)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.01)


def wait_for_run(
    rt: Runtime,
    run_id: str,
    status: RunStatus | None = None,
    timeout: float = 15.0,
    what: str = "",
) -> Run:
    """Wait until the run has `status` (None: any terminal one); returns it as loaded then."""

    def reached() -> Run | None:
        run = rt.store.load(run_id)
        done = run.status.terminal if status is None else run.status == status
        return run if done else None

    return wait_until(reached, timeout, what or f"run {run_id} to reach {status or 'its end'}")


def wait_for_path(path: Path, timeout: float = 15.0, what: str = "") -> None:
    wait_until(path.exists, timeout, what or f"{path} to exist")


def tool_messages(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m.get("role") == "tool"]


def event_kinds(rt: Runtime, run: Run) -> list[str]:
    return [e.kind for e in rt.events.read(run.id)]
