"""Prometheus metrics: runs, the queue, approvals, model time, tokens, cost, tool calls, acks.

Counters and histograms are per process: each process counts what it did itself, and
Prometheus adds the processes up (`sum`). Gauges that describe shared state (the queue's
length, approvals pending) are read from Redis when scraped, by a collector, in one round
trip of O(1)/O(log N) commands (LLEN, ZCARD, ZRANGE 0 0), however large the backlog, plus
one script that reads the workers' heartbeats (O(registered worker slots), worker/fleet.py). Every
process reports the same shared value, so dashboards take `max`, not `sum`.

Labels are bounded: a run's final status (3 values), a token kind (2), a model error's kind
(4), tool names (the registry's), a tool's effect and outcome (2 each), the build's version.
Never a user, a run or a channel.

Served by `render` on a server the process already has (the bot's HTTP port) or by `serve`
on a port of its own (a Socket Mode bot, a worker), which also answers `/healthz` (Redis
answers) and `/livez` (the process answers; no Redis) for probes.
"""

from __future__ import annotations

import platform
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, Protocol

import redis
import structlog
from prometheus_client import (
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from tools.exceptions import OperatorError, brief
from worker.fleet import ask_fleet, fleet_of

if TYPE_CHECKING:
    from approvals import ApprovalRequest
    from worker.run import RunStatus
    from worker.turns import ModelTurn

log = structlog.get_logger(__name__)


class Runtime(Protocol):
    """What the metrics read of a process's runtime (worker.runtime.Runtime, which imports
    the model adapter, which counts its errors here: a protocol keeps the imports one way)."""

    redis: redis.Redis
    leases: Any
    queue: Any
    approvals: Any
    settings: Any


# `*_created` series (a counter's start time) double what a scrape carries and are not used by
# rate() or by the dashboard; this process owns its registry, so they are off for all of it.
disable_created_metrics()

RUN_STATUSES = ("completed", "partial", "failed")
TOKEN_KINDS = ("prompt", "completion")
MODEL_ERROR_KINDS = ("unreachable", "timeout", "rejected", "rate_limited")

RUNS = Counter("switchboard_runs", "Runs that ended, by final status.", ["status"])
MODEL_CALL = Histogram(
    "switchboard_model_call_seconds",
    "Time of one answered model call (Chat Completions, the client's retries included).",
    buckets=(0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120),
)
MODEL_ERRORS = Counter(
    "switchboard_model_errors",
    "Model requests that failed after the client's retries (calls, and the start-up check), "
    "by kind: unreachable, timeout, rejected (an HTTP error: unknown model, bad key, 5xx), "
    "rate_limited (429).",
    ["kind"],
)
TOKENS = Counter(
    "switchboard_model_tokens",
    "Tokens the model read and wrote, attempts that failed included (as reported, or "
    "estimated from what they streamed: see switchboard_model_attempts_failed_total).",
    ["kind"],
)
SPENT_KINDS = ("reported", "estimated", "unknown", "none")
MODEL_ATTEMPTS_FAILED = Counter(
    "switchboard_model_attempts_failed",
    "Model attempts that failed (each retry is one), by what is known of the tokens they "
    "cost: reported by the server, estimated from what they streamed, unknown (an answer "
    "sent whole that never came), none (the connection failed, or the server answered an error).",
    ["tokens"],
)
COST = Counter("switchboard_cost_usd", "Model spend, by the price table (USD per 1M tokens).")
TOOL_CALLS = Counter(
    "switchboard_tool_calls",
    "Tool calls that ran, by tool, effect (read or write) and outcome (ok or error).",
    ["tool", "effect", "outcome"],
)
APPROVAL_DECISION = Histogram(
    "switchboard_approval_decision_seconds",
    "From an approval request to a person's decision (approved or rejected).",
    buckets=(10, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600, 24 * 3600, 72 * 3600),
)
RUN_DURATION = Histogram(
    "switchboard_run_duration_seconds",
    "Working time of a run that ended (model calls and tools; waiting for a person's decision "
    "is not counted), by final status.",
    ["status"],
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
)
GRANTS = Counter(
    "switchboard_grants",
    "Standing grants made (approve and allow similar calls), by scope: thread, hour, day.",
    ["scope"],
)
GRANT_COVERED = Counter(
    "switchboard_grant_covered_calls",
    "Write calls approved by a standing grant instead of a card.",
)
GRANT_LAPSED = Counter(
    "switchboard_grant_lapsed_calls",
    "Write calls a matching grant no longer covered (a card was shown), by why: revoked, "
    "expired, policy_changed, tool_changed, missing, grantor_roles (the grantor may no "
    "longer approve the call), grantor_unconfirmed (their roles could not be read).",
    ["why"],
)
GRANT_SCOPES = ("thread", "hour", "day")
GRANT_LAPSES = (
    "revoked",
    "expired",
    "policy_changed",
    "tool_changed",
    "missing",
    "grantor_roles",
    "grantor_unconfirmed",
)
BUILD_INFO = Gauge(
    "switchboard_build_info",
    "Always 1: the version of Switchboard and of Python this process runs.",
    ["version", "python"],
)
SLACK_ACK = Histogram(
    "switchboard_slack_ack_seconds",
    "From a Slack request's arrival to its acknowledgement (Slack allows 3 s).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5),
)

for _status in RUN_STATUSES:  # every series exists from the start, so rate() sees the first
    RUNS.labels(_status)
    RUN_DURATION.labels(_status)
for _kind in TOKEN_KINDS:
    TOKENS.labels(_kind)
for _kind in MODEL_ERROR_KINDS:
    MODEL_ERRORS.labels(_kind)
for _kind in SPENT_KINDS:
    MODEL_ATTEMPTS_FAILED.labels(_kind)
for _scope in GRANT_SCOPES:
    GRANTS.labels(_scope)
for _why in GRANT_LAPSES:
    GRANT_LAPSED.labels(_why)


# --- recording (one call from each place that knows) -------------------------------------------


def model_called(turn: ModelTurn) -> None:
    """An answered model call (its tokens: `tokens_spent`)."""
    MODEL_CALL.observe(max(0.0, turn.seconds))


def tokens_spent(prompt_tokens: int, completion_tokens: int, cost: float) -> None:
    TOKENS.labels("prompt").inc(max(0, prompt_tokens))
    TOKENS.labels("completion").inc(max(0, completion_tokens))
    COST.inc(max(0.0, cost))


def attempt_failed(tokens: str) -> None:
    MODEL_ATTEMPTS_FAILED.labels(tokens if tokens in SPENT_KINDS else "unknown").inc()


def model_failed(kind: str) -> None:
    MODEL_ERRORS.labels(kind if kind in MODEL_ERROR_KINDS else "rejected").inc()


def run_ended(status: RunStatus, seconds: float = 0.0) -> None:
    RUNS.labels(status.value).inc()
    RUN_DURATION.labels(status.value).observe(max(0.0, seconds))


def _version() -> str:
    try:
        return version("switchboard")
    except PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


BUILD_INFO.labels(_version(), platform.python_version()).set(1)


def tool_called(tool: str, effect: str, ok: bool) -> None:
    TOOL_CALLS.labels(tool, effect, "ok" if ok else "error").inc()


def approval_decided(request: ApprovalRequest) -> None:
    APPROVAL_DECISION.observe(max(0.0, request.decided_at - request.created_at))


def grant_made(scope: str) -> None:
    if scope in GRANT_SCOPES:
        GRANTS.labels(scope).inc()


def grant_covered() -> None:
    GRANT_COVERED.inc()


def grant_lapsed(why: str) -> None:
    GRANT_LAPSED.labels(why if why in GRANT_LAPSES else "missing").inc()


def observe_ack(seconds: float) -> None:
    SLACK_ACK.observe(max(0.0, seconds))


# --- shared state, read at scrape time ---------------------------------------------------------


class SharedState(Collector):
    """The gauges read when scraped: from Redis (queue, approvals) and from this process's
    runtime (runs it is working on). Reports nothing until a runtime is watched."""

    def __init__(self) -> None:
        self.rt: Runtime | None = None

    def describe(self) -> Iterable[Metric]:
        return [_gauge(name, text) for name, text in _GAUGES.items()]

    def collect(self) -> Iterable[Metric]:
        rt = self.rt
        if rt is None:
            return []
        gauges = [_gauge("switchboard_runs_in_flight", value=len(rt.leases.held()))]
        try:
            pipe = rt.redis.pipeline(transaction=False)
            pipe.llen(rt.queue.key)
            pipe.zcard(rt.approvals.keys.pending)
            pipe.zrange(rt.approvals.keys.pending, 0, 0, withscores=True)
            ask_fleet(rt.redis, rt.queue.name, pipe)
            depth, pending, first, workers = pipe.execute()
            fleet = fleet_of(workers)
        except redis.RedisError as exc:
            log.warning("metrics_redis_failed", error=brief(exc))
            return [*gauges, _gauge("switchboard_redis_up", value=0)]
        # The pending index is scored by expiry; every request gets the same TTL.
        oldest = time.time() - (first[0][1] - rt.settings.approval_ttl) if first else 0.0
        return [
            *gauges,
            _gauge("switchboard_redis_up", value=1),
            _gauge("switchboard_queue_depth", value=depth),
            _gauge("switchboard_approvals_pending", value=pending),
            _gauge("switchboard_approval_oldest_pending_seconds", value=max(0.0, oldest)),
            _gauge("switchboard_workers_alive", value=fleet.processes),
            _gauge("switchboard_worker_slots_busy", value=fleet.busy),
        ]


_GAUGES = {
    "switchboard_runs_in_flight": "Runs this process is working on now (leases it holds).",
    "switchboard_redis_up": "1 when the shared gauges could be read from Redis at this scrape.",
    "switchboard_queue_depth": "Jobs waiting in the RQ queue for a free worker slot (LLEN).",
    "switchboard_approvals_pending": "Approval requests waiting for a decision.",
    "switchboard_approval_oldest_pending_seconds": (
        "Age of the oldest approval request still waiting (0 when none)."
    ),
    "switchboard_workers_alive": (
        "Worker processes taking jobs from the queue, live by their RQ heartbeat (fleet-wide)."
    ),
    "switchboard_worker_slots_busy": "Worker slots working on a job now (fleet-wide).",
}


def _gauge(name: str, text: str = "", value: float | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text or _GAUGES[name], value=value)


_shared = SharedState()
REGISTRY.register(_shared)


def watch(rt: Runtime) -> None:
    """The shared-state gauges describe this runtime's Redis and queue (one per process)."""
    _shared.rt = rt


def render(rt: Runtime | None = None) -> tuple[bytes, str]:
    """The exposition in Prometheus's text format 0.0.4 (which every Prometheus reads; our
    names need nothing newer), and its content type."""
    if rt is not None:
        watch(rt)
    return generate_latest(REGISTRY), CONTENT_TYPE_PLAIN_0_0_4


# --- a port of its own -------------------------------------------------------------------------

METRICS_PATH = "/metrics"
HEALTH_PATH = "/healthz"  # Redis answers: readiness
LIVE_PATH = "/livez"  # the process answers: liveness (never restart a pod for Redis's sake)


class MetricsServer(ThreadingHTTPServer):
    """`/metrics`, `/healthz` and `/livez` over HTTP, in a daemon thread."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, rt: Runtime, address: tuple[str, int]) -> None:
        self.rt = rt
        super().__init__(address, _Handler)
        self.thread = threading.Thread(target=self.serve_forever, name="metrics", daemon=True)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def render(self) -> tuple[bytes, str]:
        return render()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class MetricsPortError(OperatorError):
    """The metrics port cannot be opened (taken, or not ours to open)."""


def serve(port: int, rt: Runtime, host: str = "0.0.0.0") -> MetricsServer:
    """Serve this process's metrics on `port` (0: any free port) until the process ends."""
    watch(rt)
    try:
        server = MetricsServer(rt, (host, port))
    except OSError as exc:
        raise MetricsPortError(
            f"cannot serve metrics on port {port}: {exc.strerror or exc}; choose another "
            "--metrics-port (each process needs its own)"
        ) from exc
    server.thread.start()
    log.info("metrics_serving", port=server.port, path=METRICS_PATH)
    return server


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 10.0
    server: MetricsServer

    def do_GET(self) -> None:
        path = self.path.partition("?")[0]
        if path == METRICS_PATH:
            body, content_type = self.server.render()
            self._send(200, body, content_type)
        elif path == LIVE_PATH:
            self._send(200, b"ok\n")
        elif path == HEALTH_PATH:
            try:
                self.server.rt.redis.ping()
            except redis.RedisError as exc:
                self._send(503, f"redis: {type(exc).__name__}\n".encode())
                return
            self._send(200, b"ok\n")
        else:
            self._send(404, b"not found\n")

    def _send(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


__all__ = [
    "MetricsPortError",
    "MetricsServer",
    "approval_decided",
    "attempt_failed",
    "grant_covered",
    "grant_lapsed",
    "grant_made",
    "model_called",
    "model_failed",
    "observe_ack",
    "render",
    "run_ended",
    "serve",
    "tokens_spent",
    "tool_called",
    "watch",
]
