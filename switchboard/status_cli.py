"""`switchboard status`: is it healthy? Live workers (by heartbeat) and their slots, the queue,
runs in flight, approvals waiting and the oldest, and whether Redis and the model server
answer; `--json` for probes and scripts. Exits 1 when unhealthy.

Read-only and light: one Redis connection (no tools, MCP servers or policy loaded) and one
GET /models. Imports what it needs when it runs, like every verb.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from tools.exceptions import brief

if TYPE_CHECKING:
    from switchboard.settings import Config

HEALTHY = """\
healthy means all three: Redis answers, at least one worker process is alive (it heartbeat
within the last 75 s, or is working on a job), and the model server answers GET /models and
lists SWITCHBOARD_MODEL. Exit status: 0 healthy, 1 unhealthy, 2 a configuration mistake.
Jobs waiting, runs in flight and approvals pending are reported, never judged."""

MODEL_TIMEOUT = 5.0  # seconds for GET /models


def add_command(verbs: Any) -> None:
    p = verbs.add_parser(
        "status",
        help="workers, queue, runs in flight, approvals, Redis and model reachability",
        description="Is Switchboard healthy? Workers alive by heartbeat and their slots in "
        "use, jobs waiting, runs in flight, approvals pending and the oldest, and whether "
        "Redis and the model server answer.",
        epilog=HEALTHY,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="one JSON object, for probes and scripts")
    p.set_defaults(handler=cmd_status, log_level=logging.ERROR)


@dataclass
class Status:
    redis: str = ""  # where: the URL without its password, or "embedded"
    redis_ok: bool = False
    model: str = ""  # the model server's host:port and the model
    model_ok: bool = False
    workers: int = 0  # live worker processes
    slots: int = 0  # their live slots
    slots_busy: int = 0
    worker_list: list[dict[str, Any]] = field(default_factory=list)
    queue_depth: int = 0
    runs_running: int = 0
    runs_queued: int = 0
    approvals_pending: int = 0
    oldest_approval_seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.problems


def cmd_status(config: Config, args: argparse.Namespace) -> int:
    status = gather(config)
    if args.json:
        print(json.dumps({"healthy": status.healthy, **asdict(status)}, indent=2))
    else:
        print(render(status))
    return 0 if status.healthy else 1


def gather(config: Config) -> Status:
    status = Status()
    _redis_part(config, status)
    _model_part(config, status)
    return status


def _redis_part(config: Config, status: Status) -> None:
    import redis

    from switchboard import errors, redisconn
    from tools.exceptions import OperatorError
    from worker.runtime import Settings
    from worker.service.health import backlog

    status.redis = errors.redact_url(config.redis_url) if config.redis_url else "embedded"
    try:
        conn = redisconn.connect(
            config.redis_url, max_connections=4, require=config.require_redis_url
        )
    except OperatorError as exc:
        status.problems.append(f"Redis: {exc}")
        return
    try:
        seen = backlog(
            conn,
            queue=config.queue,
            namespace=Settings().namespace,
            approval_ttl=config.approval_ttl,
        )
    except redis.RedisError as exc:
        status.problems.append("Redis: " + brief(exc, 293))
        return
    finally:
        conn.close()
    status.redis_ok = True
    fleet = seen.fleet
    status.workers, status.slots, status.slots_busy = fleet.processes, fleet.slots, fleet.busy
    status.worker_list = [
        {"worker": name, "slots": slots, "busy": busy} for name, slots, busy in fleet.by_process
    ]
    status.queue_depth, status.runs_running = seen.queue_depth, seen.runs_running
    status.runs_queued, status.approvals_pending = seen.runs_queued, seen.approvals_pending
    status.oldest_approval_seconds = seen.oldest_approval_seconds
    if not fleet.alive:
        status.problems.append(
            f"no live worker takes jobs from the queue {config.queue!r} (start one: "
            "switchboard worker)"
        )


def _model_part(config: Config, status: Status) -> None:
    if not config.has_model:
        status.model = "not configured"
        status.problems.append("model: none configured (set OPENAI_API_KEY or OPENAI_BASE_URL)")
        return
    from worker.model import ModelClient

    client = ModelClient(
        model=config.model,
        api_key=config.openai_api_key or None,
        base_url=config.openai_base_url or None,
        timeout=MODEL_TIMEOUT,
        max_retries=0,
    )
    status.model = f"{client.server} ({config.model})"
    problem = client.probe(MODEL_TIMEOUT)
    if problem is None:
        status.model_ok = True
    else:
        status.problems.append(f"model server {client.server}: {problem}")


def render(status: Status) -> str:
    def ok(flag: bool) -> str:
        return "ok" if flag else "FAIL"

    lines = [
        "healthy" if status.healthy else "UNHEALTHY",
        f"redis      {ok(status.redis_ok)}  {status.redis}",
        f"model      {ok(status.model_ok)}  {status.model}",
    ]
    if status.redis_ok:
        lines += [
            f"workers    {status.workers} alive, {status.slots} slots, {status.slots_busy} busy",
            *(f"  {w['worker']}  {w['slots']} slots, {w['busy']} busy" for w in status.worker_list),
            f"queue      {status.queue_depth} jobs waiting",
            f"runs       {status.runs_running} running, {status.runs_queued} queued",
            f"approvals  {status.approvals_pending} pending"
            + (
                f", the oldest {_age(status.oldest_approval_seconds)}"
                if status.approvals_pending
                else ""
            ),
        ]
    lines += [f"problem: {problem}" for problem in status.problems]
    return "\n".join(lines)


def _age(seconds: float) -> str:
    minutes = int(seconds // 60)
    if minutes < 1:
        return f"{int(seconds)} s"
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min"
