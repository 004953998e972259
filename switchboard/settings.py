"""Configuration from the environment (or a `.env` file). Names are the public contract."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def data_dir() -> Path:
    """Where Switchboard keeps local state (embedded Redis, the sample ticket store)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "switchboard"


class Config(BaseSettings):
    model_config = SettingsConfigDict(env_file=".env", extra="ignore", populate_by_name=True)

    slack_bot_token: str = Field("", alias="SLACK_BOT_TOKEN")
    slack_app_token: str = Field("", alias="SLACK_APP_TOKEN")
    slack_signing_secret: str = Field("", alias="SLACK_SIGNING_SECRET")
    slack_api_url: str = Field("https://slack.com/api/", alias="SLACK_API_URL")

    openai_api_key: str = Field("", alias="OPENAI_API_KEY")
    openai_base_url: str = Field("", alias="OPENAI_BASE_URL")
    model: str = Field("gpt-4.1-mini", alias="SWITCHBOARD_MODEL")

    redis_url: str = Field("", alias="REDIS_URL")
    policy: str = Field("", alias="SWITCHBOARD_POLICY")
    tools: str = Field("", alias="SWITCHBOARD_TOOLS")
    demos: str = Field("", alias="SWITCHBOARD_DEMOS")
    prices: str = Field("", alias="SWITCHBOARD_PRICES")  # JSON: {"model": [in, out] per 1M}

    demos_k: int = Field(2, alias="SWITCHBOARD_DEMOS_K", ge=0, le=10)
    demos_as: str = Field("messages", alias="SWITCHBOARD_DEMOS_AS", pattern="^(messages|text)$")
    demo_selector: str = Field(
        "bm25", alias="SWITCHBOARD_DEMO_SELECTOR", pattern="^(bm25|embeddings)$"
    )
    embedding_model: str = Field("text-embedding-3-small", alias="SWITCHBOARD_EMBEDDING_MODEL")

    queue: str = Field("switchboard", alias="SWITCHBOARD_QUEUE")
    # Runs one worker process carries at once. A run mostly waits on the model (seconds per
    # call, a few ms of CPU per step), so one process keeps many busy; 32 keeps the Redis
    # connections (one per idle slot, blocked in RQ's dequeue) and bursts of model calls
    # modest. Raise it for slow models; add processes to use more cores.
    worker_concurrency: int = Field(32, alias="SWITCHBOARD_WORKER_CONCURRENCY", ge=1, le=1000)
    lease_seconds: float = Field(15.0, alias="SWITCHBOARD_LEASE_SECONDS", gt=0, le=600)
    sweep_seconds: float = Field(5.0, alias="SWITCHBOARD_SWEEP_SECONDS", gt=0, le=600)
    approval_ttl: float = Field(24 * 3600.0, alias="SWITCHBOARD_APPROVAL_TTL", gt=0)
    retention_days: float = Field(30.0, alias="SWITCHBOARD_RETENTION_DAYS", gt=0)
    model_timeout: float = Field(60.0, alias="SWITCHBOARD_MODEL_TIMEOUT", gt=0, le=600)
    model_retries: int = Field(2, alias="SWITCHBOARD_MODEL_RETRIES", ge=0, le=10)
    max_steps: int = Field(8, alias="SWITCHBOARD_MAX_STEPS", ge=1, le=100)
    deadline_seconds: float = Field(300.0, alias="SWITCHBOARD_DEADLINE_SECONDS", gt=0, le=3600)
    max_tokens: int = Field(100_000, alias="SWITCHBOARD_MAX_TOKENS", ge=1)
    max_cost: float = Field(1.0, alias="SWITCHBOARD_MAX_COST", ge=0)
    max_tool_calls: int = Field(24, alias="SWITCHBOARD_MAX_TOOL_CALLS", ge=1, le=500)
    log_format: str = Field("console", alias="SWITCHBOARD_LOG_FORMAT")  # console | json

    @property
    def tool_modules(self) -> list[str]:
        return [m.strip() for m in self.tools.split(",") if m.strip()]

    @property
    def price_table(self) -> dict[str, tuple[float, float]] | None:
        if not self.prices:
            return None
        raw = json.loads(
            Path(self.prices).read_text() if Path(self.prices).is_file() else self.prices
        )
        return {name: (float(p[0]), float(p[1])) for name, p in raw.items()}

    @property
    def demos_path(self) -> Path | None:
        return Path(self.demos) if self.demos else None

    @property
    def has_model(self) -> bool:
        return bool(self.openai_api_key or self.openai_base_url)
