"""Everything a job needs, built once per process by the composition root."""

from __future__ import annotations

import copy
import threading
import uuid
from dataclasses import dataclass, field

import redis
import structlog
from rq import Queue
from rq.serializers import JSONSerializer

from approvals import ApprovalStore, ExecutionLedger
from approvals.grants import GrantStore
from approvals.store import Decision
from tools.policy import Policy
from tools.registry import ToolRegistry
from worker import tracing
from worker.budgets import PriceTable
from worker.connections.tokens import Connections
from worker.eventlog import EventLog
from worker.lease import LeaseKeeper
from worker.library import Selector
from worker.limits import Limits, PersonLimits, Release
from worker.model_base import NO_MODEL, Model, ModelNotConfigured
from worker.policy_watch import PolicyWatcher
from worker.roles import RolesResolver
from worker.run import Budgets, Run
from worker.store import RunStore
from worker.surface import Guarded, SilentSurface, Surface

log = structlog.get_logger(__name__)


@dataclass
class Settings:
    queue_name: str = "switchboard"
    namespace: str = "sb:"
    lease_seconds: float = 15.0
    approval_ttl: float = 24 * 3600.0
    sweep_interval: float = 5.0
    retention: int = 30 * 24 * 3600
    model_timeout: float = 60.0
    model_retries: int = 2
    model_max_tokens: int = 2048  # a reply's bound (a profile's `max_tokens` over it)
    budgets: Budgets = field(default_factory=Budgets)
    demos_as_text: bool = False  # demonstrations as text in the instructions, not as messages
    stream_answers: bool = True  # stream replies to surfaces that show answers as they come
    concurrency: int = 1  # runs one worker process carries at once (RQ worker loops in threads)
    limits: Limits = field(default_factory=Limits)  # per person; none unless configured
    instructions: str = ""  # the operator's (SWITCHBOARD_INSTRUCTIONS), after the built-in ones
    # What tools read of their configuration (ToolContext.settings): the samples' data files
    tool_settings: dict[str, str] = field(default_factory=dict)
    trace_url: str = ""  # where a run's trace is shown, "{trace_id}" in it (SWITCHBOARD_TRACE_URL)
    # how long the bot's start-up asks again a Redis that went away (SWITCHBOARD_REDIS_START_WAIT)
    redis_start_wait: float = 30.0

    @property
    def job_timeout(self) -> int:
        """RQ must never kill a job that is still inside its budget: a job works at most the
        run's deadline (each model call is cut to what is left of it), plus one last tool call
        (tools have their own timeouts) and bookkeeping."""
        return int(self.budgets.deadline_seconds + self.model_timeout + 120)


def not_run(exc: redis.RedisError) -> bool:
    """Whether Redis said it did not run the command: loading its data after a restart
    (LOADING), a replica (READONLY), or a primary demoted under it, past the client's retries
    (switchboard.redisconn's `PrimaryMoved`, which says so with `not_run`). Any other failure
    may have come after a script ran, in whole or in part."""
    return isinstance(
        exc, (redis.exceptions.BusyLoadingError, redis.exceptions.ReadOnlyError)
    ) or bool(getattr(exc, "not_run", False))


@dataclass
class Runtime:
    redis: redis.Redis
    registry: ToolRegistry
    policy: Policy
    model: Model | None
    settings: Settings = field(default_factory=Settings)
    prices: PriceTable = field(default_factory=PriceTable)
    surfaces: dict[str, Surface] = field(default_factory=dict)
    demos: Selector | None = None  # the task library's; None: no demonstrations
    profile_demos: dict[str, Selector] = field(default_factory=dict)  # a profile's own
    # The requester's current roles, asked before every step (worker/roles.py); None: the
    # roles recorded at the start stand (no Slack: the policy names every member).
    roles: RolesResolver | None = None
    # Live policy (worker/policy_watch.py), started by the bot and worker processes; None
    # without a policy file. Whoever asks the policy reads `rt.policy` (worker.service.Access
    # does), so a new one is in force at the next question, click or step.
    policy_watcher: PolicyWatcher | None = None
    # Per-user connections (worker/connections/); None: not configured (no encryption key)
    connections: Connections | None = None

    def __post_init__(self) -> None:
        self._models: dict[str, Model] = {}
        self._models_lock = threading.Lock()
        ns = self.settings.namespace
        self.store = RunStore(self.redis, ns, self.settings.retention)
        self.leases = LeaseKeeper(self.store, self.settings.lease_seconds)
        self.limits = PersonLimits(
            self.redis, ns, self.settings.limits, stale=self.settings.job_timeout
        )
        # Set when the process is asked to stop: runs hand themselves back at the next step.
        self.stopping = threading.Event()
        # Reads waited for outside their run's thread at once, process-wide (worker/executor.py
        # `run_reads`): a turn asking for more waits for a place, so threads stay bounded.
        self.read_threads = threading.BoundedSemaphore(max(8, 4 * self.settings.concurrency))
        self.events = EventLog(self.redis, ns, self.store.retention)
        self.approvals = ApprovalStore(self.redis, due_key=self.store.keys.due, namespace=ns)
        self.ledger = ExecutionLedger(self.redis, ns)
        self.grants = GrantStore(self.redis, ns)
        self.queue = Queue(
            self.settings.queue_name, connection=self.redis, serializer=JSONSerializer
        )

    def use_policy(self, policy: Policy) -> None:
        """Put `policy` in force in this process: the next step of every run, the next click
        and the next question are checked against it."""
        self.policy = policy

    def save(self, run: Run, lease_token: str) -> str | None:
        """Save a run this process holds, with the events its step recorded and the charge
        of its model call (renewing its lease when the keeper is late). Returns who asked to
        cancel it, if anyone."""
        return self._save(run, lease_token, None)[0]

    def save_releasing(self, run: Run, lease_token: str) -> list[str]:
        """`save` a run that ended or waits for people, and give its place in flight back
        in the same write: the runs of its person admitted in its place, to queue."""
        release = self.limits.releasing(run.requester.user_id, run.id, self.store.keys.due)
        return self._save(run, lease_token, release)[1]

    def _save(
        self, run: Run, lease_token: str, release: Release | None
    ) -> tuple[str | None, list[str]]:
        term = self.leases.save_term()
        charge = self.limits.take_charge(run.id)
        events = self.events.take(run.id)
        try:
            return self.store.save(run, lease_token, events, term, charge, release)
        except redis.RedisError as exc:
            if not_run(exc):  # the charge is written later: by the next save, or `settle`
                self.limits.put_back(run.id, charge)
            raise

    def surface(self, run: Run) -> Surface:
        """Where this run reports: the surface it came from, guarded; silent if none."""
        found = self.surfaces.get(run.origin.get("surface", ""))
        return Guarded(found) if found is not None else _SILENT

    def enqueue_advance(self, run_id: str) -> None:
        """Queue an `advance` job for the run (worker/jobs.py)."""
        pipe = self.redis.pipeline()
        pipe.multi()  # before the mark: RQ starts the transaction itself if it has not begun
        self.queue_advance(run_id, pipe)
        pipe.execute()

    def queue_advance(self, run_id: str, pipe: redis.client.Pipeline) -> None:
        """As `enqueue_advance`, in `pipe`: a transaction begun (MULTI), that the caller runs."""
        # The mark names the job, so the sweeper can see the job is still in the queue
        # (waiting, not lost, however long the backlog) and a worker clears it when it takes
        # that job. The mark and the job are written in one transaction (a worker may take
        # the job at once), one round trip: RQ's own enqueue sends two (a MULTI/EXEC for the
        # queue's name, another for the job), after the mark's SET.
        job_id = uuid.uuid4().hex
        self.store.mark_queued(run_id, job_id, pipeline=pipe)
        self.queue.enqueue_call(
            job_id=job_id,
            func="worker.jobs.advance",
            args=(run_id,),
            timeout=self.settings.job_timeout,
            result_ttl=60,
            failure_ttl=7 * 24 * 3600,
            description=f"advance {run_id}",
            pipeline=pipe,
        )

    def trace_of(self, run_id: str) -> dict[str, str]:
        """The run's trace context, as saved with it ({}: none, or no such run)."""
        run = self.store.find(run_id)
        return run.trace if run is not None else {}

    def expiry_job_id(self, approval_id: str) -> str:
        return f"expire-{approval_id}"

    def cancel_expiry(self, approval_id: str) -> None:
        """A decided request needs no expiry job; drop it rather than keep it for a day."""
        job = self.queue.fetch_job(self.expiry_job_id(approval_id))
        if job is not None:
            job.delete()

    def withdraw(self, approval_id: str, reason: str) -> Decision:
        """Withdraw a pending request (its run ended, or its workspace went away) and drop
        its expiry job. `won` is False when it was decided first."""
        decision = self.approvals.withdraw(approval_id, reason)
        if decision.won:
            self.cancel_expiry(approval_id)
            tracing.approval_decided(
                decision.request, lambda: self.trace_of(decision.request.run_id)
            )
        return decision

    def require_model(self, name: str = "") -> Model:
        """The configured model; with `name` (a profile's model), the same client and server
        asking for that model instead."""
        if self.model is None:
            raise ModelNotConfigured(NO_MODEL)
        if not name or name == self.model.model:
            return self.model
        with self._models_lock:
            if name not in self._models:
                named = copy.copy(self.model)  # shares the HTTP client and its connections
                named.model = name
                self._models[name] = named
            return self._models[name]


_SILENT = SilentSurface()
_current: Runtime | None = None


def install(runtime: Runtime) -> None:
    """Make `runtime` the one RQ jobs in this process use."""
    global _current
    _current = runtime


def current() -> Runtime:
    if _current is None:
        raise RuntimeError(
            "no Switchboard runtime installed in this process; start workers with "
            "`switchboard worker` (or call worker.runtime.install first)"
        )
    return _current
