"""`/switchboard`: parsing the command text into a `Command` (bot.listeners.commands acts on
it)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from bot.render import messages as m
from bot.render.mrkdwn import escape
from bot.transport import ids
from worker.run import RunStatus

MAX_TEXT = 200
_USER = re.compile(r"<@([UW][A-Z0-9]{1,20})(?:\|[^>]*)?>|([UW][A-Z0-9]{1,20})")


class Verb(StrEnum):
    RUNS = "runs"
    RUN = "run"
    CANCEL = "cancel"
    HELP = "help"
    ERROR = "error"  # not understood: `Command.error` says why


class Scope(StrEnum):
    MINE = "mine"
    ALL = "all"
    USER = "user"  # one person's (`Command.user`)


@dataclass(frozen=True)
class Command:
    verb: Verb
    scope: Scope = Scope.MINE
    user: str | None = None
    status: RunStatus | None = None
    run_id: str | None = None
    error: str = ""  # the message to show when verb is ERROR


def parse(text: str) -> Command:
    if len(text) > MAX_TEXT:
        return Command(Verb.ERROR, error=m.COMMAND_TOO_LONG)
    words = text.split()
    if not words or words[0].lower() == "help":
        return Command(Verb.HELP)
    verb, rest = words[0].lower(), words[1:]
    if verb == Verb.RUNS:
        return parse_runs(rest)
    if verb in (Verb.RUN, Verb.CANCEL):
        if not rest:
            return Command(Verb.ERROR, error=m.COMMAND_NEEDS_ID.format(verb=verb))
        run_id = rest[0].strip("`")
        if not ids.shaped(ids.RUN, run_id):
            return Command(Verb.ERROR, error=m.COMMAND_BAD_ID.format(text=escape(run_id[:40])))
        return Command(Verb(verb), run_id=run_id)
    return Command(Verb.ERROR, error=m.COMMAND_UNKNOWN.format(word=escape(words[0][:40])))


def parse_runs(words: list[str]) -> Command:
    scope, user, status = Scope.MINE, None, None
    for word in words[:2]:
        lowered = word.lower()
        found = _USER.fullmatch(word)
        if lowered in (Scope.MINE, Scope.ALL):
            scope = Scope(lowered)
        elif found:
            scope, user = Scope.USER, found.group(1) or found.group(2)
        elif lowered in {s.value for s in RunStatus}:
            status = RunStatus(lowered)
        else:
            return Command(Verb.ERROR, error=m.COMMAND_UNKNOWN.format(word=escape(word[:40])))
    return Command(Verb.RUNS, scope=scope, user=user, status=status)
