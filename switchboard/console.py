"""`switchboard chat`: ask in the terminal, watch each step, answer approvals at the prompt.

It uses the same Redis, queue and workers as production; it reads the run's event stream
rather than being called back, so the workers can be anywhere.
"""

from __future__ import annotations

import getpass
import json
import sys
import time
from typing import TextIO

from switchboard.render import event_line
from worker import service
from worker.events import Event
from worker.run import Requester, Run
from worker.runtime import Runtime

PROMPT = "you> "
DECIDE_PROMPT = "approve? [y]es / [n]o [reason]: "


class Console:
    def __init__(
        self,
        rt: Runtime,
        user_id: str | None = None,
        stdin: TextIO = sys.stdin,
        stdout: TextIO = sys.stdout,
    ) -> None:
        self.rt = rt
        self.user_id = user_id or f"console:{getpass.getuser()}"
        self.stdin = stdin
        self.stdout = stdout
        self.previous: Run | None = None

    def say(self, text: str) -> None:
        self.stdout.write(text + "\n")
        self.stdout.flush()

    def ask(self, prompt: str) -> str | None:
        self.stdout.write(prompt)
        self.stdout.flush()
        line = self.stdin.readline()
        return None if line == "" else line.rstrip("\n")

    def loop(self) -> int:
        self.say("Switchboard console. Ask a question; an empty line or end of input quits.")
        while True:
            question = self.ask(PROMPT)
            if question is None or not question.strip():
                self.say("bye")
                return 0
            if not self.ask_one(question):
                return 0

    def ask_one(self, question: str) -> bool:
        """Run one question to its end. False when input ended while a decision was asked."""
        roles = sorted(self.rt.policy.roles_for(self.user_id))
        requester = Requester(user_id=self.user_id, roles=roles)
        try:
            run = service.submit(
                self.rt, question, requester, origin={"surface": "console"}, parent=self.previous
            )
        except service.QuestionRejected as exc:
            self.say(f"! {exc}")
            return True
        self.say(f"run {run.id} queued")
        finished = self.follow(run.id)
        if finished is None:
            self.say(
                f"Leaving run {run.id} waiting for a decision; `switchboard runs show {run.id}`."
            )
            return False
        self.previous = finished
        return True

    def follow(self, run_id: str) -> Run | None:
        after = "0"
        start: float | None = None
        asked: list[Event] = []
        while True:
            for event in self.rt.events.wait(run_id, after, block_ms=1000):
                after = event.id
                start = event.at if start is None else start
                for line in event_line(event, start):
                    self.say(line)
                if event.kind == "approval_requested":
                    asked.append(event)
                if event.kind == "suspended":  # the run waits: now ask, one request at a time
                    if not all(self.decide(request) for request in asked):
                        return None
                    asked.clear()
                if event.kind.startswith("run_") and event.kind != "run_created":
                    run = self.rt.store.load(run_id)
                    self.show_end(run)
                    return run

    def decide(self, event: Event) -> bool:
        approval_id = event.data["approval_id"]
        expires = time.strftime("%Y-%m-%d %H:%M", time.localtime(event.data["expires_at"]))
        self.say(f"\n  Approval needed: {event.data['tool']} ({approval_id})")
        for line in json.dumps(event.data["args"], indent=2, ensure_ascii=False).splitlines():
            self.say("    " + line)
        self.say(f"  May decide: {event.data['approvers']}. Expires {expires}.")
        while True:
            answer = self.ask(DECIDE_PROMPT)
            if answer is None:
                return False
            choice, _, reason = answer.strip().partition(" ")
            if choice.lower() in ("y", "yes", "n", "no"):
                break
            self.say("Type y to approve, or n followed by an optional reason to reject.")
        outcome = service.decide(
            self.rt,
            approval_id,
            decider_id=self.user_id,
            decider_roles=self.rt.policy.roles_for(self.user_id),
            approve=choice.lower().startswith("y"),
            reason=reason,
        )
        if outcome.result == service.DecisionResult.NOT_ALLOWED:
            self.say(f"! You may not decide this; it needs {outcome.approvers}. Waiting for them.")
        elif outcome.result == service.DecisionResult.ALREADY_DECIDED and outcome.request:
            self.say(f"! Already {outcome.request.status.value} by {outcome.request.decided_by}.")
        return True

    def show_end(self, run: Run) -> None:
        if run.answer:
            self.say("")
            self.say(run.answer)
        u = run.usage
        self.say(
            f"[{run.status.value}{' — ' + run.detail if run.detail else ''}; {u.steps} steps, "
            f"{u.tokens} tokens, ${u.cost:.4f}, {u.active_seconds:.1f}s]"
        )
