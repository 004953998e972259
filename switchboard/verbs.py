"""The command line's verbs: for each, the module that defines it (imported only when that
verb runs, so `switchboard --version` and `--help` start in a few milliseconds), the
function there that adds its arguments, and its line in `switchboard --help`."""

from __future__ import annotations

from typing import NamedTuple


class Verb(NamedTuple):
    module: str
    add: str  # add(verbs): adds the verb's parser (with help_of(name)) to the subparsers
    help: str


VERBS: dict[str, Verb] = {
    "dev": Verb(
        "switchboard.services_cli",
        "add_dev",
        "bot, workers and (when REDIS_URL is unset) Redis in one process tree",
    ),
    "bot": Verb(
        "switchboard.services_cli", "add_bot", "the Slack bot (Socket Mode, or HTTP with --http)"
    ),
    "worker": Verb(
        "switchboard.services_cli", "add_worker", "run workers that advance runs from the queue"
    ),
    "chat": Verb(
        "switchboard.services_cli",
        "add_chat",
        "ask questions in the terminal and answer approvals at the prompt",
    ),
    "runs": Verb("switchboard.runs_cli", "add_command", "inspect runs"),
    "approvals": Verb(
        "switchboard.approvals_cli",
        "add_command",
        "pending approvals: list, show, approve, reject",
    ),
    "demos": Verb("switchboard.demos_cli", "add_commands", "the task library of demonstrations"),
    "tools": Verb(
        "switchboard.tools_cli",
        "add_command",
        "registered tools and who may call them; `check` validates tools, MCP servers and policy",
    ),
    "status": Verb(
        "switchboard.status_cli",
        "add_command",
        "is it healthy? live workers, queue, runs in flight, approvals, Redis and the model",
    ),
    "connections": Verb(
        "switchboard.connections_cli",
        "add_command",
        "people's connected accounts (per-user tools): list, revoke, rekey",
    ),
    "eval": Verb(
        "switchboard.eval_cli",
        "add_command",
        "run evaluation cases through the real pipeline and score them",
    ),
}


def help_of(name: str) -> str:
    return VERBS[name].help
