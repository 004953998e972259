"""The run: one versioned JSON document per question, and what can end it."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field

SCHEMA_VERSION = 1

# A migration turns a stored document of `from_version` into one of `from_version + 1`; a
# document is migrated step by step up to SCHEMA_VERSION when it is read (`Run.from_json`),
# and written back in the current version by the next save. Add one here with every bump of
# SCHEMA_VERSION, so runs stored by the previous release (suspended ones wait for days)
# still read. None yet: version 1 is the first.
Migration = Callable[[dict[str, Any]], dict[str, Any]]
MIGRATIONS: dict[int, Migration] = {}


class RunSchemaError(ValueError):
    """A stored run was written by a version of Switchboard this one does not understand."""

    def __init__(self, message: str, version: object = None) -> None:
        super().__init__(message)
        self.version = version


def migrate(data: Any, migrations: Mapping[int, Migration] | None = None) -> dict[str, Any]:
    """`data` (a stored run document) in the current SCHEMA_VERSION, through `migrations`
    (default MIGRATIONS) one version at a time; RunSchemaError for a version that is newer
    than this one, or older without a migration."""
    steps = MIGRATIONS if migrations is None else migrations
    version = data.get("schema_version") if isinstance(data, dict) else None
    while isinstance(version, int) and not isinstance(version, bool) and version in steps:
        if version >= SCHEMA_VERSION:
            break
        try:
            data = steps[version](dict(data))
        except (KeyError, TypeError, ValueError) as exc:  # a document it was not written for
            raise RunSchemaError(
                f"stored run of schema_version {version} could not be migrated: "
                f"{type(exc).__name__}: {exc}",
                version,
            ) from exc
        after = data.get("schema_version") if isinstance(data, dict) else None
        if after != version + 1:  # a migration that does not advance would loop
            raise RunSchemaError(
                f"the migration from schema_version {version} produced {after!r}, "
                f"not {version + 1}",
                version,
            )
        version = after
    if version != SCHEMA_VERSION or isinstance(version, bool):  # True == 1 in Python
        raise RunSchemaError(
            f"stored run has schema_version {version!r}; this Switchboard reads "
            f"{SCHEMA_VERSION}" + (" (written by a newer version)" if _newer(version) else ""),
            version,
        )
    assert isinstance(data, dict)
    return data


def _newer(version: object) -> bool:
    return isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    COMPLETED = "completed"
    PARTIAL = "partial"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in (RunStatus.COMPLETED, RunStatus.PARTIAL, RunStatus.FAILED)


class EndReason(StrEnum):
    """Why a run ended `partial` (or `failed`). Always recorded; shown to people in plain words."""

    MAX_STEPS = "max_steps"
    DEADLINE = "deadline"
    TOKENS = "tokens"
    COST = "cost"
    TOOL_CALLS = "tool_calls"
    REPEATED_CALL = "repeated_call"
    CANCELLED = "cancelled"
    LENGTH = "length"
    CONTENT_FILTER = "content_filter"
    REFUSED = "refused"
    MODEL_ERROR = "model_error"
    ROLES_UNAVAILABLE = "roles_unavailable"
    INTERNAL_ERROR = "internal_error"


class Requester(BaseModel):
    """Who asked, from the surface's verified payload. Never from the model."""

    user_id: str
    team_id: str = ""
    channel_id: str = ""
    roles: list[str] = Field(default_factory=list)


class Grounding(BaseModel):
    """What the grounding check (worker/grounding.py) found in the answer: the facts that no
    tool result, question or operator's text has, as written in the answer."""

    numbers: list[str] = Field(default_factory=list)  # figures and prices
    identifiers: list[str] = Field(default_factory=list)  # keys, references, ids, e-mails
    names: list[str] = Field(default_factory=list)  # quoted text and proper names

    @property
    def facts(self) -> list[str]:
        return [*self.numbers, *self.identifiers, *self.names]

    @property
    def invented(self) -> list[str]:
        """The facts that are wrong when not looked up, whatever the wording: figures, prices
        and identifiers (a name may be a fair example, or the product's own)."""
        return [*self.numbers, *self.identifiers]

    @property
    def verdict(self) -> Literal["grounded", "ungrounded"]:
        return "ungrounded" if self.facts else "grounded"


class RunProfile(BaseModel):
    """The profile a run started with (tools/profiles.py), kept for its whole life: a policy
    reload while it waits for an approval does not change the agent it is talking to."""

    name: str
    tools: list[str] | None = None  # names and patterns; None: every tool the user may call
    model: str | None = None  # None: the configured model (SWITCHBOARD_MODEL)
    max_tokens: int | None = None  # a reply's bound; None: SWITCHBOARD_MODEL_MAX_TOKENS


class Budgets(BaseModel):
    max_steps: int = 8
    deadline_seconds: float = 300.0  # working time; time spent waiting for people is not counted
    max_tokens: int = 100_000
    max_cost: float = 1.0  # in the price table's currency (USD by default)
    max_tool_calls: int = 24


class Usage(BaseModel):
    steps: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    tool_calls: int = 0
    active_seconds: float = 0.0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


CallState = Literal["pending", "done"]


class Call(BaseModel):
    """One tool call the model proposed in the current turn, until its result is in."""

    id: str
    name: str
    arguments: str  # as the model wrote it (capped), for the transcript
    args: dict[str, Any] | None = None  # decoded and validated; None when it was invalid
    effect: Literal["read", "write", "none"] = "none"
    state: CallState = "pending"
    result: str | None = None
    approval_id: str | None = None


class Run(BaseModel):
    schema_version: int = SCHEMA_VERSION
    id: str
    status: RunStatus = RunStatus.QUEUED
    question: str
    requester: Requester
    model: str = ""
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    ended_at: float | None = None
    messages: list[dict[str, Any]] = Field(default_factory=list)  # transcript, no instructions
    turn: list[Call] = Field(default_factory=list)  # calls of the last model turn still open
    # (tool, args) hash -> [step, position in that turn] of calls made since the last write ran
    seen: dict[str, list[int]] = Field(default_factory=dict)
    repeated: list[str] = Field(default_factory=list)  # hashes already answered as repeats
    budgets: Budgets = Field(default_factory=Budgets)
    usage: Usage = Field(default_factory=Usage)
    answer: str | None = None
    reason: EndReason | None = None
    detail: str = ""  # the reason in words, or the error
    notes: list[str] = Field(default_factory=list)  # caveats the answer must carry
    ungrounded: list[str] = Field(default_factory=list)  # facts in the answer no source has
    # The grounding check of the answer; None: not checked (no answer, or no tools offered).
    grounding: Grounding | None = None
    demos: list[str] = Field(default_factory=list)  # ids of the demonstrations shown to the model
    # Per tool call id: did its tool run and succeed (the `ok` of its `tool_result`). Recorded
    # by the executor; a call that never reached a tool (refused, invalid, repeated, not
    # approved) has no entry or False. None: a run saved before outcomes were recorded.
    outcomes: dict[str, bool] | None = Field(default_factory=dict)
    origin: dict[str, str] = Field(
        default_factory=dict
    )  # where it came from (surface, channel, ts)
    parent_id: str | None = None  # the run this one continues (a thread reply)
    profile: RunProfile | None = None  # None: the defaults (no profile for the channel)
    instructions: str = ""  # the operator's, then the profile's; after the built-in rules
    # The policy (its version, tools/policy.py) the run's last step was authorised under; a
    # change mid-run is recorded as a `policy_changed` event. "": saved before it was recorded.
    policy_version: str = ""
    # The run's W3C trace context (worker/tracing.py): `traceparent` names the run's span,
    # `parent` the span it was asked in. {}: traces were off when it was created.
    trace: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Run:
        return cls.from_document(migrate(json.loads(raw)))

    @classmethod
    def from_document(cls, data: dict[str, Any]) -> Run:
        """A stored document already in the current schema version (see `migrate`)."""
        data.setdefault("outcomes", None)  # saved before outcomes were recorded
        return cls.model_validate(data)

    def to_json(self) -> str:
        return self.model_dump_json(exclude_defaults=False)

    def record_outcome(self, call_id: str, ok: bool) -> None:
        """Whether the call's tool ran and succeeded. A run begun before outcomes were recorded
        keeps none: it is read the old way, whole."""
        if self.outcomes is not None:
            self.outcomes[call_id] = ok

    @property
    def pending_approvals(self) -> list[str]:
        return [c.approval_id for c in self.turn if c.state == "pending" and c.approval_id]


def new_run_id() -> str:
    """Sortable by creation time, short enough for a Slack button value."""
    return f"r{int(time.time() * 1000):x}{secrets.token_hex(4)}"
