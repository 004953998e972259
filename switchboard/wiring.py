"""Composition root: build the runtime every process shares from the configuration."""

from __future__ import annotations

from pathlib import Path

import redis

from switchboard.redisconn import connect
from switchboard.settings import Config
from tools import Policy, load_modules, registry
from worker.budgets import PriceTable
from worker.demos import CachedEmbeddings, DemoError, Selector, TaskLibrary, check
from worker.model import ModelClient
from worker.run import Budgets
from worker.runtime import Runtime, Settings
from worker.surface import Surface


def load_tools(config: Config) -> None:
    """Built-in tools, then the operator's modules (`SWITCHBOARD_TOOLS`)."""
    import tools.builtin

    tools.builtin.load()
    load_modules(config.tool_modules)


def load_policy(config: Config) -> Policy:
    if config.policy:
        return Policy.load(Path(config.policy), registry)
    return Policy.default(registry)


def runtime_settings(config: Config) -> Settings:
    return Settings(
        queue_name=config.queue,
        lease_seconds=config.lease_seconds,
        approval_ttl=config.approval_ttl,
        sweep_interval=config.sweep_seconds,
        retention=int(config.retention_days * 86400),
        model_timeout=config.model_timeout,
        model_retries=config.model_retries,
        demos_as_text=config.demos_as == "text",
        concurrency=config.worker_concurrency,
        budgets=Budgets(
            max_steps=config.max_steps,
            deadline_seconds=config.deadline_seconds,
            max_tokens=config.max_tokens,
            max_cost=config.max_cost,
            max_tool_calls=config.max_tool_calls,
        ),
    )


def open_runtime(config: Config) -> Runtime:
    """The runtime every command uses: configured Redis (or the embedded one), tools, policy."""
    # Every slot holds a connection while it waits in RQ's blocking dequeue; its run needs
    # another, and tools, leases and the sweeper share a few more.
    pool = 2 * config.worker_concurrency + 16
    return build_runtime(config, connect(config.redis_url, max_connections=pool))


def build_runtime(
    config: Config,
    connection: redis.Redis,
    *,
    surfaces: dict[str, Surface] | None = None,
) -> Runtime:
    load_tools(config)
    policy = load_policy(config)
    model = None
    if config.has_model:
        model = ModelClient(
            model=config.model,
            api_key=config.openai_api_key or None,
            base_url=config.openai_base_url or None,
            timeout=config.model_timeout,
            max_retries=config.model_retries,
        )
    runtime = Runtime(
        redis=connection,
        registry=registry,
        policy=policy,
        model=model,
        settings=runtime_settings(config),
        prices=PriceTable(config.price_table),
        surfaces=dict(surfaces or {}),
    )
    runtime.demos = build_selector(config, runtime, model)
    if config.slack_bot_token and "slack" not in runtime.surfaces:
        from slack_sdk import WebClient

        from bot.surface import SlackSurface

        client = WebClient(token=config.slack_bot_token, base_url=config.slack_api_url)
        runtime.surfaces["slack"] = SlackSurface(client, runtime)
    return runtime


def build_selector(config: Config, rt: Runtime, model: ModelClient | None) -> Selector | None:
    """The task library, checked against the registered tools before anything runs."""
    if config.demos_k == 0:
        return None
    library = TaskLibrary(rt.redis, config.demos_path, rt.settings.namespace)
    problems = check(library.all(), rt.registry)
    if problems:
        raise DemoError(
            "the task library does not match the tools (run `switchboard demos check`):\n  "
            + "\n  ".join(problems)
        )
    embed = None
    if config.demo_selector == "embeddings":
        if model is None:
            raise DemoError("SWITCHBOARD_DEMO_SELECTOR=embeddings needs a configured model server")
        embed = CachedEmbeddings(
            model.client, config.embedding_model, rt.redis, rt.settings.namespace
        )
    return Selector(library, config.demos_k, embed=embed)
