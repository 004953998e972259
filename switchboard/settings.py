"""Configuration from the environment (or a `.env` file). Names are the public contract."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qs, urlsplit

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from switchboard import sentinel_url

REDIS_SCHEMES = ("redis", "rediss", "unix", sentinel_url.SCHEME)
OPENAI_HOST = "api.openai.com"
# How .env.example (and the README) write a value left to fill in: `xoxb-...`, `xapp-…`.
# No real Slack token or secret ends so; one that does is a copied example, not a typo.
PLACEHOLDER_ENDINGS = ("...", "…")
MAX_PREVIOUS_SECRETS = 3  # bot.transport.signature.MAX_SECRETS, less the current one


def data_dir() -> Path:
    """Where Switchboard keeps local state (embedded Redis, the sample ticket store)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "switchboard"


class Config(BaseSettings):
    model_config = SettingsConfigDict(env_file=".env", extra="ignore", populate_by_name=True)

    slack_bot_token: str = Field("", alias="SLACK_BOT_TOKEN")
    slack_app_token: str = Field("", alias="SLACK_APP_TOKEN")
    slack_signing_secret: str = Field("", alias="SLACK_SIGNING_SECRET")
    # While a signing secret is rotated: the old one(s), comma-separated, accepted too
    slack_signing_secret_previous: str = Field("", alias="SLACK_SIGNING_SECRET_PREVIOUS")
    slack_api_url: str = Field("https://slack.com/api/", alias="SLACK_API_URL")
    # Workspaces and apps whose requests the bot serves besides its own (comma-separated ids)
    slack_allowed_teams: str = Field("", alias="SLACK_ALLOWED_TEAMS")
    slack_allowed_apps: str = Field("", alias="SLACK_ALLOWED_APPS")

    openai_api_key: str = Field("", alias="OPENAI_API_KEY")
    openai_base_url: str = Field("", alias="OPENAI_BASE_URL")
    model: str = Field("gpt-4.1-mini", alias="SWITCHBOARD_MODEL")

    redis_url: str = Field("", alias="REDIS_URL")
    # Refuse the embedded Redis: where processes must share one (Kubernetes, compose)
    require_redis_url: bool = Field(False, alias="SWITCHBOARD_REQUIRE_REDIS_URL")
    # How long the bot and the workers wait at start for a Redis that does not answer yet
    # (starting beside them, restarting, failing over); other commands say so at once
    redis_start_wait: float = Field(30.0, alias="SWITCHBOARD_REDIS_START_WAIT", ge=0, le=3600)
    policy: str = Field("", alias="SWITCHBOARD_POLICY")
    # How often the bot and the workers look for a changed policy file (0: only on SIGHUP)
    policy_check_seconds: float = Field(
        5.0, alias="SWITCHBOARD_POLICY_CHECK_SECONDS", ge=0, le=3600
    )
    tools: str = Field("", alias="SWITCHBOARD_TOOLS")
    mcp: str = Field("", alias="SWITCHBOARD_MCP")  # MCP servers file (YAML)
    # Per-user connections: Fernet keys (comma-separated, the first encrypts), the URL people
    # reach the bot's HTTP port at (for /oauth/callback), the named providers file (YAML)
    connection_keys: str = Field("", alias="SWITCHBOARD_CONNECTION_KEYS", repr=False)
    public_url: str = Field("", alias="SWITCHBOARD_PUBLIC_URL")
    oauth_providers: str = Field("", alias="SWITCHBOARD_OAUTH_PROVIDERS")
    demos: str = Field("", alias="SWITCHBOARD_DEMOS")
    # A text file added to the built-in instructions (who the assistant works for, how)
    instructions: str = Field("", alias="SWITCHBOARD_INSTRUCTIONS")
    prices: str = Field("", alias="SWITCHBOARD_PRICES")  # JSON: {"model": [in, out] per 1M}
    # The built-in sample tools' data files (ToolContext.settings `knowledge`, `tickets_db`)
    knowledge: str = Field("", alias="SWITCHBOARD_KNOWLEDGE")
    tickets_db: str = Field("", alias="SWITCHBOARD_TICKETS_DB")

    demos_k: int = Field(2, alias="SWITCHBOARD_DEMOS_K", ge=0, le=10)
    # relevance floor: BM25 as a share of a perfect match, or the embeddings' cosine
    demos_min_score: float = Field(0.2, alias="SWITCHBOARD_DEMOS_MIN_SCORE", ge=0, le=1)
    demos_as: str = Field("messages", alias="SWITCHBOARD_DEMOS_AS", pattern="^(messages|text)$")
    demo_selector: str = Field(
        "bm25", alias="SWITCHBOARD_DEMO_SELECTOR", pattern="^(bm25|embeddings)$"
    )
    embedding_model: str = Field("text-embedding-3-small", alias="SWITCHBOARD_EMBEDDING_MODEL")
    stream_answers: bool = Field(True, alias="SWITCHBOARD_STREAM_ANSWERS")

    queue: str = Field("switchboard", alias="SWITCHBOARD_QUEUE")
    # Runs one worker process carries at once. A run mostly waits on the model (seconds per
    # call, a few ms of CPU per step), so one process keeps many busy: 128 carries a burst of
    # 100 runs in one wave (bench_latency.py --defaults: 2.9 s at 500 ms per call, 8.2 s with
    # 32) for ~20 MiB more at rest (idle slots wait their turn in the process; at most 8 wait
    # in Redis, worker/process.py). Raise it for slow models; add processes to use more cores.
    worker_concurrency: int = Field(128, alias="SWITCHBOARD_WORKER_CONCURRENCY", ge=1, le=1000)
    # What a worker process carries them in: greenlets on one gevent hub (no GIL hand-offs
    # between hundreds of threads: 1,000 runs in one process at ~0.6x the CPU, bench/README.md),
    # or OS threads, for tools that block without yielding (worker/pool.py). Unset: gevent,
    # or threads for a process of one slot. Read before the process imports anything else,
    # from the environment or .env (or `worker --pool`).
    worker_pool: Literal["gevent", "threads"] | None = Field(None, alias="SWITCHBOARD_WORKER_POOL")
    # Per person (0 = no limit): questions being worked on at once (more wait in that
    # person's own line, so one burst does not hold up everyone else), questions a minute,
    # and model spend a day (UTC, in the price table's currency).
    user_runs_in_flight: int = Field(3, alias="SWITCHBOARD_USER_RUNS_IN_FLIGHT", ge=0, le=1000)
    user_runs_per_minute: int = Field(10, alias="SWITCHBOARD_USER_RUNS_PER_MINUTE", ge=0, le=10_000)
    user_cost_per_day: float = Field(10.0, alias="SWITCHBOARD_USER_COST_PER_DAY", ge=0)
    # On SIGTERM a worker takes no new jobs and waits this long for its runs to reach their
    # next step and go back to the queue; keep it under the platform's kill timeout.
    stop_grace_seconds: float = Field(25.0, alias="SWITCHBOARD_STOP_GRACE_SECONDS", ge=0, le=3600)
    lease_seconds: float = Field(15.0, alias="SWITCHBOARD_LEASE_SECONDS", gt=0, le=600)
    sweep_seconds: float = Field(5.0, alias="SWITCHBOARD_SWEEP_SECONDS", gt=0, le=600)
    approval_ttl: float = Field(24 * 3600.0, alias="SWITCHBOARD_APPROVAL_TTL", gt=0)
    retention_days: float = Field(30.0, alias="SWITCHBOARD_RETENTION_DAYS", gt=0)
    # One model step's deadline, its attempts together (the first and the retries); a retry
    # is made only while time is left. A read timeout (0: the step's deadline) gives up on an
    # attempt whose server has gone quiet for that long, so a retry still has time.
    model_timeout: float = Field(60.0, alias="SWITCHBOARD_MODEL_TIMEOUT", gt=0, le=600)
    model_retries: int = Field(2, alias="SWITCHBOARD_MODEL_RETRIES", ge=0, le=10)
    model_read_timeout: float = Field(0.0, alias="SWITCHBOARD_MODEL_READ_TIMEOUT", ge=0, le=600)
    # Every model request carries an output bound: this, a profile's `max_tokens`, and never
    # more than the run's token budget has left. OpenAI's newer models want the bound named
    # `max_completion_tokens`, most other servers `max_tokens`; `auto` sends the first to
    # OpenAI (no OPENAI_BASE_URL, or api.openai.com) and the second to anything else.
    model_max_tokens: int = Field(2048, alias="SWITCHBOARD_MODEL_MAX_TOKENS", ge=1, le=1_000_000)
    model_tokens_param: str = Field(
        "auto",
        alias="SWITCHBOARD_MODEL_TOKENS_PARAM",
        pattern="^(auto|max_tokens|max_completion_tokens)$",
    )
    # Sent only when set (unset: the server's default); tool_choice and parallel_tool_calls
    # only with requests that offer tools.
    model_temperature: float | None = Field(None, alias="SWITCHBOARD_MODEL_TEMPERATURE", ge=0, le=2)
    model_tool_choice: str = Field(
        "", alias="SWITCHBOARD_MODEL_TOOL_CHOICE", pattern="^(|auto|required|none)$"
    )
    model_parallel_tool_calls: bool | None = Field(
        None, alias="SWITCHBOARD_MODEL_PARALLEL_TOOL_CALLS"
    )
    max_steps: int = Field(8, alias="SWITCHBOARD_MAX_STEPS", ge=1, le=100)
    deadline_seconds: float = Field(300.0, alias="SWITCHBOARD_DEADLINE_SECONDS", gt=0, le=3600)
    max_tokens: int = Field(100_000, alias="SWITCHBOARD_MAX_TOKENS", ge=1)
    max_cost: float = Field(1.0, alias="SWITCHBOARD_MAX_COST", ge=0)
    max_tool_calls: int = Field(24, alias="SWITCHBOARD_MAX_TOOL_CALLS", ge=1, le=500)
    log_format: str = Field("console", alias="SWITCHBOARD_LOG_FORMAT", pattern="^(console|json)$")
    # Traces (worker/tracing.py; OTEL_* configures the rest): Slack user ids on spans only when
    # set, and where `runs show` and App Home link a run's trace ("{trace_id}" is replaced)
    trace_user_ids: bool = Field(False, alias="SWITCHBOARD_TRACE_USER_IDS")
    trace_url: str = Field("", alias="SWITCHBOARD_TRACE_URL", max_length=500)

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        """Fail at start-up, naming REDIS_URL, rather than at the first command."""
        if not value:
            return value
        if sentinel_url.is_sentinel(value):
            sentinel_url.parse(value)
            return value
        parts = urlsplit(value)
        if parts.scheme not in REDIS_SCHEMES or "://" not in value:
            raise ValueError(
                "a Redis URL starts with redis://, rediss://, unix:// or redis+sentinel://"
            )
        if parts.scheme == "unix":
            db = parse_qs(parts.query).get("db", [""])[0]
        else:
            db = parse_qs(parts.query).get("db", [parts.path.strip("/")])[0]
        if db and not db.isdigit():
            raise ValueError(f"the database {db!r} is not a number")
        return value

    @field_validator("model_temperature", "model_parallel_tool_calls", mode="before")
    @classmethod
    def _unset(cls, value: object) -> object:
        """An empty value (`SWITCHBOARD_MODEL_TEMPERATURE=`) is unset: not sent."""
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("trace_url")
    @classmethod
    def _trace_url(cls, value: str) -> str:
        if value and ("{trace_id}" not in value or not value.startswith(("https://", "http://"))):
            raise ValueError(
                "a trace URL starts with https:// and names {trace_id}, e.g. "
                "https://jaeger.example/trace/{trace_id}"
            )
        return value

    @field_validator("slack_signing_secret_previous")
    @classmethod
    def _previous_secrets(cls, value: str) -> str:
        if len(value.split(",")) > MAX_PREVIOUS_SECRETS:
            raise ValueError(
                f"at most {MAX_PREVIOUS_SECRETS} previous signing secrets (comma-separated); "
                "remove the ones Slack no longer signs with"
            )
        return value

    @field_validator("prices")
    @classmethod
    def _prices(cls, value: str) -> str:
        if value:
            read_prices(value)
        return value

    @property
    def secret_values(self) -> tuple[str, ...]:
        """This process's own credentials, kept out of traces wherever they turn up."""
        found = (
            self.slack_bot_token,
            self.slack_app_token,
            self.openai_api_key,
            *self.signing_secrets,
        )
        return tuple(s for s in found if s)

    @property
    def tool_settings(self) -> dict[str, str]:
        """What tools read of their configuration (ToolContext.settings), the unset left out."""
        named = {"knowledge": self.knowledge, "tickets_db": self.tickets_db}
        return {name: value.strip() for name, value in named.items() if value.strip()}

    @property
    def signing_secrets(self) -> tuple[str, ...]:
        """The current signing secret first, then the previous ones still accepted."""
        previous = (s.strip() for s in self.slack_signing_secret_previous.split(","))
        return tuple(s for s in (self.slack_signing_secret.strip(), *previous) if s)

    @property
    def allowed_teams(self) -> tuple[str, ...]:
        return tuple(t.strip() for t in self.slack_allowed_teams.split(",") if t.strip())

    @property
    def allowed_apps(self) -> tuple[str, ...]:
        return tuple(a.strip() for a in self.slack_allowed_apps.split(",") if a.strip())

    @property
    def tool_modules(self) -> list[str]:
        return [m.strip() for m in self.tools.split(",") if m.strip()]

    @property
    def builtin_tools(self) -> bool:
        """The sample tools load when asked for (SWITCHBOARD_TOOLS=tools.builtin) or when no
        tools are configured at all, so the out-of-the-box console has something to call."""
        return "tools.builtin" in self.tool_modules or not (self.tool_modules or self.mcp)

    @property
    def price_table(self) -> dict[str, tuple[float, float]] | None:
        return read_prices(self.prices) if self.prices else None

    @property
    def demos_path(self) -> Path | None:
        return Path(self.demos) if self.demos else None

    @property
    def tokens_param(self) -> Literal["max_tokens", "max_completion_tokens"]:
        """What the output bound is called in requests to the configured server."""
        if self.model_tokens_param == "max_tokens":
            return "max_tokens"
        host = urlsplit(self.openai_base_url).hostname if self.openai_base_url else None
        if self.model_tokens_param == "max_completion_tokens" or host in (None, OPENAI_HOST):
            return "max_completion_tokens"
        return "max_tokens"

    @property
    def has_model(self) -> bool:
        return bool(self.openai_api_key or self.openai_base_url)

    def placeholders(self, *names: str) -> list[str]:
        """Which of these variables still hold an example value from .env.example."""
        values = {
            field.alias: getattr(self, name)
            for name, field in type(self).model_fields.items()
            if field.alias in names
        }
        return [name for name in names if str(values.get(name, "")).endswith(PLACEHOLDER_ENDINGS)]


def read_prices(value: str) -> dict[str, tuple[float, float]]:
    """`{"model": [input, output]}` USD per 1M tokens, as JSON or in the file it names."""
    path = Path(value)
    is_file = not value.lstrip().startswith("{") and path.is_file()
    where = f"in {path}: " if is_file else ""
    try:
        raw = json.loads(path.read_text(encoding="utf-8") if is_file else value)
    except json.JSONDecodeError as exc:
        where_in = f"line {exc.lineno} column {exc.colno}"
        raise ValueError(f"{where}not JSON ({exc.msg} at {where_in})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{where}expected an object of model names")
    table = {}
    for name, pair in raw.items():
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not all(isinstance(p, int | float) and p >= 0 for p in pair)
        ):
            raise ValueError(f"{where}{name!r} needs [input, output], two prices of at least 0")
        table[str(name)] = (float(pair[0]), float(pair[1]))
    return table
