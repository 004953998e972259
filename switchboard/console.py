"""`switchboard chat`: ask in the terminal, watch each step, answer approvals at the prompt.

It uses the same Redis, queue and workers as production; it reads the run's event stream
rather than being called back, so the workers can be anywhere. It makes sure one is taking
jobs (`WorkerGuard`): a live one found by its heartbeat, or one it starts and stops itself.
Ctrl-C, a closed terminal or the end of input leave every run recoverable: a run in flight
goes back to the queue, and a decision left open can be taken later, here or with
`switchboard approvals`. A per-user tool that finds the person not connected makes the
console print the provider's URL and wait for the browser on a local port
(switchboard/local_callback.py). Every text the console shows is in this file.
"""

from __future__ import annotations

import getpass
import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from approvals import ApprovalRequest, ApprovalStatus
from approvals.edits import EditRefused
from switchboard import errors
from switchboard.edit_args import EditInputError, read_value
from switchboard.render import event_line, grounding_note, plain, when
from switchboard.supervise import Supervisor, last_line, live_workers
from worker import service
from worker.events import Event, EventKind, is_run_end
from worker.run import Requester, Run
from worker.runtime import Runtime
from worker.service import Access, approvals, asking, connections, decisions, runs

PROMPT = "you> "
DECIDE_PROMPT = "approve? [y]es / [e]dit / [n]o [reason] / [i]nstruct: "
LATER_PROMPT = "approve? [y]es / [e]dit / [n]o [reason] / [i]nstruct / [s]kip: "
DECIDE_HELP = (
    "Type y to approve, e to change arguments first, n followed by an optional reason to "
    "reject, or i to reject and tell the agent what to do instead."
)
FIELD_PROMPT = "    {name} [{now}]: "
INSTRUCT_PROMPT = "  tell the agent what to do instead: "
REASON_PROMPT = "  reason (optional): "
CHECK_WORKERS_AFTER = 3.0  # seconds without news before the console looks for a worker
CONSOLE_GRACE = 3.0  # Ctrl-C: seconds for the worker to hand its runs back, then it stops
WAITING_EVERY = 10.0  # seconds between "still waiting for the model" lines
WAITING = "{offset}  still waiting for the model: {seconds:.0f} s of {deadline} s"
CONNECT_SECONDS = 300.0  # how long the console waits for the browser to come back
CONNECT_OPEN = (
    "\n  {label} acts as you, and you have not connected it. Open this link in a browser "
    "to connect (waiting up to {minutes:.0f} min; Ctrl-C stops waiting):\n  {url}"
)
CONNECT_DONE = "  Connected your {label} account: its tools act as you from the next call on."
CONNECT_REFUSED = "  ! Not connected: {why}"
CONNECT_TIMEOUT = (
    "  ! Not connected: the browser did not come back within {minutes:.0f} min. "
    "Nothing was changed."
)
CONNECT_CANCELLED = "  ! Not connected: you stopped waiting. Nothing was changed."
# Events after which the model is no longer being asked (the attempt ended, one way or another)
MODEL_ANSWERED = (EventKind.MODEL_CALL, EventKind.MODEL_ATTEMPT_FAILED, EventKind.MODEL_ERROR)


def local_user() -> str:
    """Who the console (and `switchboard approvals`) acts as by default."""
    return f"console:{getpass.getuser()}"


class WorkerGuard:
    """The console's worker: a live one found by heartbeat, or `count` of its own (with
    `always`, as `dev` does, its own even when others run). Its own write to `log_dir`, so
    their log lines never cover the prompt; None shows them in the terminal (--verbose)."""

    def __init__(
        self,
        rt: Runtime,
        env: dict[str, str],
        *,
        log_dir: Path | None,
        count: int = 1,
        always: bool = False,
        out: TextIO = sys.stdout,
    ) -> None:
        self.rt, self.log_dir, self.count, self.always = rt, log_dir, count, always
        self.out = out
        self.supervisor = Supervisor(env, notify=self._say)

    def _say(self, text: str) -> None:
        try:
            self.out.write(text + "\n")
            self.out.flush()
        except OSError:  # the terminal is gone
            pass

    def ensure(self) -> str | None:
        """Workers are taking jobs: ours are running, or (unless `always`) another is alive.
        Starts or restarts ours when needed; returns a note for the person, else None."""
        own = list(self.supervisor.children.values())
        dead = [child for child in own if not child.alive]
        for child in dead:
            if child.proc.returncode == errors.CONFIG_EXIT:
                raise errors.worker_failed(errors.CONFIG_EXIT, last_line(child.log))
        if own and not dead:
            return None
        if not own and not self.always and live_workers(self.rt.queue):
            return None
        if dead:
            codes = ", ".join(str(child.proc.returncode) for child in dead)
            for child in dead:
                self.supervisor.restart(child)
            return f"(the worker stopped, exit {codes}; started it again{self._where()})"
        for n in range(self.count):
            name = "worker" if self.count == 1 else f"worker-{n + 1}"
            log_file = self.log_dir / f"{name}.log" if self.log_dir else None
            self.supervisor.start(name, ["worker"], log_file=log_file)
        if self.always:
            return None
        return f"(no worker was running; started one for this console{self._where()})"

    def _where(self) -> str:
        return f", log in {self.log_dir}" if self.log_dir else ""

    def stop(self, *, announce: bool = False) -> None:
        """Stop our workers within seconds; `announce` it (after Ctrl-C, not after "bye")."""
        if not any(child.alive for child in self.supervisor.children.values()):
            return
        if announce:
            workers = "workers" if self.count > 1 else "worker"
            self._say(f"Stopping the {workers}; runs in flight go back to the queue…")
        self.supervisor.stop(grace=CONSOLE_GRACE)


class Console:
    def __init__(
        self,
        rt: Runtime,
        user_id: str | None = None,
        stdin: TextIO = sys.stdin,
        stdout: TextIO = sys.stdout,
        workers: WorkerGuard | None = None,
        connect_seconds: float = CONNECT_SECONDS,
    ) -> None:
        self.rt = rt
        self.connect_seconds = connect_seconds
        # the local callback's port, kept for the session: an authorization server that
        # registered this redirect URI (an MCP server's own OAuth) knows it the next time
        self.callback_port = 0
        self.user_id = user_id or local_user()
        self.stdin = stdin
        self.stdout = stdout
        self.workers = workers
        self.previous: Run | None = None
        self.following: str | None = None  # the run being watched
        self.waiting_said = 0.0  # when it last said how long the model has been working
        self.asking: ApprovalRequest | None = None  # the decision being asked for

    def say(self, text: str) -> None:
        try:
            self.stdout.write(text + "\n")
            self.stdout.flush()
        except OSError:  # the terminal is gone (a hang-up); the run goes on regardless
            pass

    def ask(self, prompt: str) -> str | None:
        """A line of input; None at its end (or when the terminal is gone)."""
        try:
            self.stdout.write(prompt)
            self.stdout.flush()
            line = self.stdin.readline()
        except OSError:  # EIO: the terminal hung up
            return None
        return None if line == "" else line.rstrip("\n")

    @property
    def roles(self) -> frozenset[str]:
        return Access.of(self.rt).roles(self.user_id)

    def loop(self) -> int:
        """Questions until an empty line or the end of input (0), or Ctrl-C (130)."""
        try:
            self.say("Switchboard console. Ask a question; an empty line or end of input quits.")
            self.check_workers()
            disabled = asking.unavailable_note(self.rt)
            if disabled:
                self.say(disabled)
            if not self.offer_waiting():
                return 0
            while True:
                question = self.ask(PROMPT)
                if question is None or not question.strip():
                    self.say("bye")
                    return 0
                if not self.ask_one(question):
                    return 0
        except KeyboardInterrupt:
            self.leave()
            return 130

    def leave(self) -> None:
        """Ctrl-C or a hang-up: say what goes on without the console."""
        if self.asking is not None:
            a = self.asking
            self.say(
                f"\nLeaving run {a.run_id} waiting for a decision on {a.tool} ({a.id}): "
                f"`switchboard approvals approve {a.id}` (or `reject`), or `switchboard chat`."
            )
        elif self.following is not None:
            self.say(
                f"\nRun {self.following} goes on without the console; "
                f"`switchboard runs show {self.following}` shows how it ends."
            )
        else:
            self.say("\nbye")

    def offer_waiting(self) -> bool:
        """Approvals this person may decide, left from before: decide them now or skip.
        False when input ended."""
        waiting = approvals.pending_for(self.rt, self.user_id, self.roles)
        if not waiting:
            return True
        self.say(f"{len(waiting)} approval(s) wait for you.")
        for request in waiting:
            self.say(
                f"\n  Run {request.run_id}, asked by {request.requester} at "
                f"{when(request.created_at)}:"
            )
            after = runs.events_so_far(self.rt, request.run_id)
            decided = self.decide(request, later=True)
            if decided is None:
                return False
            if decided:
                run = self.follow(request.run_id, after)
                if run is None:
                    return False
        return True

    def ask_one(self, question: str) -> bool:
        """Run one question to its end. False when input ended while a decision was asked."""
        requester = Requester(user_id=self.user_id, roles=sorted(self.roles))
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
            return False
        self.previous = finished
        return True

    def follow(self, run_id: str, after: str = "0") -> Run | None:
        """Show the run's events until it ends; ask for decisions when it waits for them.
        None when input ended at a decision (the run keeps waiting for it)."""
        self.following = run_id
        start = self._run(run_id).created_at
        quiet_since = time.monotonic()
        asking: Event | None = None  # the model attempt in progress, if any
        offered: set[str] = set()  # providers this run asked to connect (once each)
        while True:
            events = runs.wait_for_events(self.rt, run_id, after, block_ms=1000)
            if not events:
                if time.monotonic() - quiet_since > CHECK_WORKERS_AFTER:
                    self.check_workers()
                    quiet_since = time.monotonic()
                asking = self.still_asking(asking, start)
                continue
            quiet_since = time.monotonic()
            for event in events:
                after = event.id
                for line in event_line(event, start):
                    self.say(line)
                if event.kind == EventKind.MODEL_CALL_STARTED:
                    asking, self.waiting_said = event, time.time()
                elif event.kind in MODEL_ANSWERED or is_run_end(event.kind):
                    asking = None
                if event.kind == EventKind.CONNECTION_NEEDED:  # a per-user tool: connect now
                    provider = str(event.data.get("provider") or "")
                    if provider not in offered:
                        offered.add(provider)
                        self.connect(provider)
                        quiet_since = time.monotonic()
                if event.kind == EventKind.SUSPENDED:  # the run waits: ask, one request at a time
                    for approval_id in event.data.get("approvals", []):
                        request = approvals.find(self.rt, approval_id)
                        if request is None or request.status != ApprovalStatus.PENDING:
                            continue
                        if self.decide(request) is None:
                            self.say(
                                f"Leaving run {run_id} waiting for a decision: "
                                f"`switchboard approvals approve {approval_id}` (or `reject`), "
                                "or `switchboard chat` again."
                            )
                            return None
                if is_run_end(event.kind):
                    run = self._run(run_id)
                    self.show_end(run)
                    self.following = None
                    return run

    def connect(self, provider: str) -> None:
        """Connect the person at the terminal to `provider`: print the URL, wait for the
        browser on a local port, finish and confirm the flow as this console's person."""
        from switchboard.local_callback import LocalCallback  # uvicorn: only when needed

        label = connections.label(self.rt, provider)
        team = Requester(user_id=self.user_id).team_id  # as the console's runs record it
        try:
            listener = LocalCallback(self.rt, team, self.user_id, self.callback_port)
        except OSError:  # taken since: another port (and, there, another registration)
            listener = LocalCallback(self.rt, team, self.user_id)
        self.callback_port = listener.port
        try:
            try:
                url = listener.start(provider)
            except connections.ConnectRefused as refused:
                self.say(CONNECT_REFUSED.format(why=refused))
                return
            minutes = self.connect_seconds / 60
            try:  # from the moment the URL shows, Ctrl-C stops waiting (not the console)
                self.say(CONNECT_OPEN.format(label=label, url=url, minutes=minutes))
                outcome = listener.wait(self.connect_seconds)
            except KeyboardInterrupt:
                self.say(CONNECT_CANCELLED)
                return
        finally:
            listener.close()
        if outcome is None:
            self.say(CONNECT_TIMEOUT.format(minutes=minutes))
        elif isinstance(outcome, connections.ConnectRefused):
            self.say(CONNECT_REFUSED.format(why=outcome))
        else:
            self.say(CONNECT_DONE.format(label=outcome.label))

    def still_asking(self, asking: Event | None, start: float) -> Event | None:
        """Every WAITING_EVERY seconds of a model attempt, say how long it has taken."""
        now = time.time()
        if asking is not None and now - self.waiting_said >= WAITING_EVERY:
            self.waiting_said = now
            since = asking.at - (asking.data.get("elapsed") or 0.0)
            self.say(
                WAITING.format(
                    offset=f"+{now - start:7.2f}s",
                    seconds=now - since,
                    deadline=asking.data.get("deadline"),
                )
            )
        return asking

    def _run(self, run_id: str) -> Run:
        run = runs.find(self.rt, run_id)
        if run is None:  # past its retention, or another Redis
            raise errors.CliError(f"run {run_id} is gone from Redis")
        return run

    def check_workers(self) -> None:
        if self.workers is not None:
            note = self.workers.ensure()
            if note:
                self.say(note)

    def decide(self, request: ApprovalRequest, *, later: bool = False) -> bool | None:
        """Ask for a decision on one request. True when decided (or refused), False when
        skipped, None when input ended."""
        expires = time.strftime("%Y-%m-%d %H:%M", time.localtime(request.expires_at))
        self.say(f"\n  Approval needed: {request.tool} ({request.id})")
        for line in json.dumps(request.args, indent=2, ensure_ascii=False).splitlines():
            self.say("    " + line)
        approvers = approvals.facts(self.rt, request).approvers
        self.say(f"  May decide: {approvers}. Expires {expires}.")
        self.asking = request
        edited: dict[str, Any] | None = None
        instructions = ""
        while True:
            answer = self.ask(LATER_PROMPT if later else DECIDE_PROMPT)
            if answer is None:
                return None
            choice, _, reason = answer.strip().partition(" ")
            choice = choice.lower()
            if later and choice in ("", "s", "skip"):
                self.asking = None
                return False
            if choice in ("e", "edit"):
                edited = self.edit(request)
                if edited is None:
                    return None
                choice = "y"
            if choice in ("i", "instruct"):
                told = self.ask(INSTRUCT_PROMPT)
                why = self.ask(REASON_PROMPT) if told is not None else None
                if told is None or why is None:
                    return None
                choice, instructions, reason = "n", told, why
            if choice in ("y", "yes", "n", "no"):
                break
            self.say(DECIDE_HELP)
        self.asking = None
        outcome = service.decide(
            self.rt,
            request.id,
            decider_id=self.user_id,
            decider_roles=self.roles,
            approve=choice.startswith("y"),
            reason=reason,
            edited_args=edited,
            instructions=instructions,
            surface="console",
        )
        if outcome.result == service.DecisionResult.INVALID_EDIT and outcome.refused:
            self.say(f"! Not approved: {outcome.refused.message}. Decide again.")
            return self.decide(request, later=later)
        if outcome.result == service.DecisionResult.NOT_ALLOWED:
            self.say(f"! You may not decide this; it needs {outcome.approvers}. Waiting for them.")
        elif outcome.result == service.DecisionResult.ALREADY_DECIDED and outcome.request:
            self.say(f"! Already {outcome.request.status.value} by {outcome.request.decided_by}.")
        return True

    def edit(self, request: ApprovalRequest) -> dict[str, Any] | None:
        """The arguments changed field by field (Enter keeps a value), each read for its
        type in the tool's schema and the whole checked like the model's, again until they
        pass; None when input ended."""
        tool = approvals.facts(self.rt, request).tool
        properties = (tool.parameters.get("properties") or {}) if tool is not None else {}
        names = list(dict.fromkeys([*request.args, *properties]))
        args = dict(request.args)
        self.say("  Change a value, or press Enter to keep it:")
        pending = names
        while True:
            for name in pending:
                while True:
                    now = json.dumps(args[name], ensure_ascii=False) if name in args else ""
                    typed = self.ask(FIELD_PROMPT.format(name=name, now=now[:60]))
                    if typed is None:
                        return None
                    if typed == "":
                        break
                    try:
                        args[name] = read_value(properties.get(name), typed)
                        break
                    except EditInputError as exc:
                        self.say(f"  ! {exc}")
            try:
                return decisions.checked_edit(self.rt, request, args)
            except EditRefused as exc:
                self.say(f"  ! {exc.message}")
                pending = [exc.field] if exc.field in names else names

    def show_end(self, run: Run) -> None:
        if run.answer:
            self.say("")
            self.say(plain(run.answer))
            note = grounding_note(run)
            if note:
                self.say(note)
        u = run.usage
        detail = f" — {plain(run.detail)}" if run.detail else ""
        self.say(
            f"[{run.status.value}{detail}; {u.steps} steps, "
            f"{u.tokens} tokens, ${u.cost:.4f}, {u.active_seconds:.1f}s]"
        )
