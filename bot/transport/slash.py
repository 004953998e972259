"""`/switchboard`: parsing the command text, and what each verb shows to whom."""

from __future__ import annotations

import re
from dataclasses import dataclass

from bot.render import messages as m
from bot.render.mrkdwn import escape
from bot.transport import ids
from worker.run import RunStatus

MAX_TEXT = 200
_USER = re.compile(r"<@([UW][A-Z0-9]{1,20})(?:\|[^>]*)?>|([UW][A-Z0-9]{1,20})")
VERBS = ("runs", "run", "cancel", "help")


@dataclass(frozen=True)
class Command:
    verb: str  # runs | run | cancel | help | error
    scope: str = "mine"  # mine | all | user
    user: str | None = None
    status: RunStatus | None = None
    run_id: str | None = None
    error: str = ""  # the message to show when verb == "error"


def parse(text: str) -> Command:
    if len(text) > MAX_TEXT:
        return Command("error", error=m.COMMAND_TOO_LONG)
    words = text.split()
    if not words or words[0].lower() == "help":
        return Command("help")
    verb, rest = words[0].lower(), words[1:]
    if verb == "runs":
        return parse_runs(rest)
    if verb in ("run", "cancel"):
        if not rest:
            return Command("error", error=m.COMMAND_NEEDS_ID.format(verb=verb))
        run_id = rest[0].strip("`")
        if not ids.shaped(ids.RUN, run_id):
            return Command("error", error=m.COMMAND_BAD_ID.format(text=escape(run_id[:40])))
        return Command(verb, run_id=run_id)
    return Command("error", error=m.COMMAND_UNKNOWN.format(word=escape(words[0][:40])))


def parse_runs(words: list[str]) -> Command:
    scope, user, status = "mine", None, None
    for word in words[:2]:
        lowered = word.lower()
        found = _USER.fullmatch(word)
        if lowered in ("mine", "all"):
            scope = lowered
        elif found:
            scope, user = "user", found.group(1) or found.group(2)
        elif lowered in {s.value for s in RunStatus}:
            status = RunStatus(lowered)
        else:
            return Command("error", error=m.COMMAND_UNKNOWN.format(word=escape(word[:40])))
    return Command("runs", scope=scope, user=user, status=status)
