"""Composition root: build the runtime every process shares from the configuration."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import redis

from switchboard.redisconn import connect, patient
from switchboard.settings import Config
from tools.exceptions import McpConfigError, OperatorError, PolicyError
from tools.policy import Policy
from tools.registry import load_modules, registry
from worker import policy_watch
from worker.budgets import PriceTable
from worker.connections.oauth import Provider
from worker.connections.providers import ProvidersError, read_providers
from worker.connections.store import ConnectionStore, KeysMissing
from worker.connections.tokens import Connections
from worker.keys import Keys
from worker.library import CachedEmbeddings, DemoError, Selector, TaskLibrary, check, load_file
from worker.limits import Limits
from worker.model import ModelClient
from worker.model_base import Model, Sampling, pools_for
from worker.policy_watch import PolicyWatcher
from worker.profiles import load_instructions
from worker.run import Budgets
from worker.runtime import Runtime, Settings
from worker.surface import Surface

if TYPE_CHECKING:
    from tools.mcp import McpServers
    from tools.mcp.config import ServerConfig
    from tools.mcp.pins import Pins


def load_tools(config: Config, connection: redis.Redis | None = None) -> McpServers | None:
    """The operator's modules (`SWITCHBOARD_TOOLS`), then the tools of their MCP servers
    (`SWITCHBOARD_MCP`: connected now, or start-up fails naming the server), each server's
    listing checked against the one recorded in `connection`'s Redis. The built-in samples
    only when asked for, or when neither is configured. Returns the MCP servers."""
    load_modules_or_samples(config)
    return load_mcp(config, connection)


def load_modules_or_samples(config: Config) -> None:
    """SWITCHBOARD_TOOLS, in order (listed, `tools.builtin` loads where it stands, like any
    module); the built-in samples when no tools are configured at all."""
    if config.tool_modules or not config.builtin_tools:
        load_modules(config.tool_modules)
        return
    import tools.builtin

    tools.builtin.load()


def load_mcp(config: Config, connection: redis.Redis | None = None) -> McpServers | None:
    if not config.mcp:
        return None
    import tools.mcp  # the SDK is imported only by processes that connect to servers

    if not config.connection_keys.strip():  # before connecting to anything
        refuse_per_user(per_user_servers(config))
    return tools.mcp.load(config.mcp, registry, mcp_pins(connection))


def per_user_servers(config: Config) -> list[ServerConfig]:
    """The MCP servers whose tools act as the person asking (`auth: per_user`)."""
    if not config.mcp:
        return []
    from tools.mcp.servers import read_file

    return [server for server in read_file(config.mcp) if server.per_user]


def refuse_per_user(servers: list[ServerConfig]) -> None:
    """Per-user MCP servers need per-user connections: without them, start-up stops here,
    naming each server (their tools would otherwise have no one's token to call with)."""
    if servers:
        raise McpConfigError(
            "\n".join(
                f"{server.source} line {server.line}: servers.{server.key}.auth is per_user, "
                "so each call needs the asking person's own connection, but connections are "
                "not set up: set SWITCHBOARD_CONNECTION_KEYS (and SWITCHBOARD_PUBLIC_URL, "
                "for the OAuth callback), or remove `auth: per_user`"
                for server in servers
            )
        )


def mcp_provider(server: ServerConfig) -> Provider:
    """The provider of a per-user MCP server's connections: the server's own OAuth, its
    endpoints and client discovered from its URL (RFC 9728, RFC 8414, RFC 7591) when a
    person first connects, its tokens asked for that server alone (RFC 8707 `resource`)."""
    assert server.url is not None
    return Provider(
        name=server.connection,
        label=server.connection_label,
        authorize_url="",
        token_url="",
        client_id="",
        scopes=server.scopes,
        resource=server.url,
        discover_from=server.url,
    )


def mcp_pins(connection: redis.Redis | None) -> Pins | None:
    """The deployment's record of each MCP server's first listing (tools/mcp/pins.py)."""
    if connection is None:
        return None
    from tools.mcp.pins import Pins

    keys = Keys()
    return Pins(connection, keys.mcp_listing, keys.mcp_changed)


def check_tools(
    config: Config, connection: redis.Redis | None = None
) -> tuple[McpServers | None, list[str]]:
    """Load every tool source as `load_tools` does, but go on after a failure: the MCP
    servers (when they loaded) and every problem, one line each."""
    problems: list[str] = []
    servers = None
    try:
        load_modules_or_samples(config)
    except OperatorError as error:
        problems.extend(str(error).splitlines())
    try:
        servers = load_mcp(config, connection)
    except OperatorError as error:
        problems.extend(str(error).splitlines())
    return servers, problems


def load_policy(config: Config) -> Policy:
    if config.policy:
        return Policy.load(Path(config.policy), registry)
    return Policy.default(registry)


def watch_policy(
    config: Config,
    rt: Runtime,
    model: ModelClient | None,
    base_limits: Limits,
    seen: str | None = None,
) -> PolicyWatcher | None:
    """The live policy of a long-running process (worker/policy_watch.py): a changed file is
    checked as at start-up (profiles' task libraries included), then put in force with its
    `limits:` and profile task libraries. None without a policy file (nothing to watch)."""
    if not config.policy:
        return None

    def load(text: str) -> Policy:
        policy = Policy.parse(text, registry, source=config.policy)
        problems = profile_demo_problems(policy) if config.demos_k else []
        if problems:
            raise PolicyError("\n".join(problems))
        return policy

    def apply(policy: Policy) -> None:
        rt.profile_demos = build_profile_selectors(config, rt, model, policy)
        rt.settings.limits = replace(base_limits, **policy.limits)  # type: ignore[arg-type]
        rt.limits.limits = rt.settings.limits
        rt.use_policy(policy)

    return PolicyWatcher(
        Path(config.policy),
        load,
        apply,
        lambda: rt.policy,
        interval=config.policy_check_seconds,
        mcp_path=Path(config.mcp) if config.mcp else None,
        seen=seen,
    )


def runtime_settings(config: Config) -> Settings:
    return Settings(
        queue_name=config.queue,
        lease_seconds=config.lease_seconds,
        approval_ttl=config.approval_ttl,
        sweep_interval=config.sweep_seconds,
        retention=int(config.retention_days * 86400),
        model_timeout=config.model_timeout,
        model_retries=config.model_retries,
        model_max_tokens=config.model_max_tokens,
        demos_as_text=config.demos_as == "text",
        instructions=load_instructions(Path(config.instructions)) if config.instructions else "",
        stream_answers=config.stream_answers,
        concurrency=config.worker_concurrency,
        tool_settings=config.tool_settings,
        trace_url=config.trace_url,
        redis_start_wait=config.redis_start_wait,
        limits=Limits(
            runs_in_flight=config.user_runs_in_flight,
            runs_per_minute=config.user_runs_per_minute,
            cost_per_day=config.user_cost_per_day,
        ),
        budgets=Budgets(
            max_steps=config.max_steps,
            deadline_seconds=config.deadline_seconds,
            max_tokens=config.max_tokens,
            max_cost=config.max_cost,
            max_tool_calls=config.max_tool_calls,
        ),
    )


def open_runtime(config: Config, *, service: bool = False) -> Runtime:
    """The runtime every command uses: configured Redis (or the embedded one), tools, policy.
    A `service` (the bot, a worker) waits a while for a Redis that does not answer yet."""
    # A bound, not a size: a connection is opened when no idle one is free. At most 8 slots
    # hold one while they wait in RQ's blocking dequeue (worker/process.py `DEQUEUERS`); a
    # run holds one while a command is in flight; tools, leases and the sweeper share a few.
    pool = 2 * config.worker_concurrency + 16
    wait = config.redis_start_wait if service else 0.0
    connection = connect(
        config.redis_url, max_connections=pool, require=config.require_redis_url, wait=wait
    )
    with patient(connection, wait):  # should Redis go away again before start-up is over
        return build_runtime(config, connection)


def build_runtime(
    config: Config,
    connection: redis.Redis,
    *,
    surfaces: dict[str, Surface] | None = None,
) -> Runtime:
    """The runtime of `config`: its tools loaded, its policy read."""
    load_tools(config, connection)
    seen = policy_watch.digest(Path(config.policy)) if config.policy else None  # before reading
    runtime = assemble_runtime(config, connection, load_policy(config), surfaces=surfaces)
    base_limits = runtime_settings(config).limits  # the SWITCHBOARD_USER_* settings alone
    embedder = runtime.model if isinstance(runtime.model, ModelClient) else None
    runtime.policy_watcher = watch_policy(config, runtime, embedder, base_limits, seen)
    return runtime


def connections_of(config: Config, conn: redis.Redis, namespace: str) -> Connections | None:
    """Per-user connections, when SWITCHBOARD_CONNECTION_KEYS is set (a bad key or
    providers file stops the start with what to fix): the providers file's, and one
    `mcp:<key>` for each per-user MCP server. A per-user MCP server without the keys stops
    the start too."""
    servers = per_user_servers(config)
    if not config.connection_keys.strip():
        refuse_per_user(servers)
        return None
    try:
        store = ConnectionStore(conn, namespace, config.connection_keys.split(","))
    except KeysMissing as error:
        raise ProvidersError(str(error)) from None
    providers = {}
    if config.oauth_providers:
        path = Path(config.oauth_providers)
        providers = read_providers(path.read_text(encoding="utf-8"), str(path), os.environ)
    connections = Connections(store, providers, config.public_url)
    for server in servers:
        connections.add(mcp_provider(server))
    return connections


def model_of(config: Config) -> ModelClient | None:
    if not config.has_model:
        return None
    return ModelClient(
        model=config.model,
        api_key=config.openai_api_key or None,
        base_url=config.openai_base_url or None,
        timeout=config.model_timeout,
        max_retries=config.model_retries,
        read_timeout=config.model_read_timeout,
        sampling=Sampling(
            tokens_param=config.tokens_param,
            temperature=config.model_temperature,
            tool_choice=config.model_tool_choice,
            parallel_tool_calls=config.model_parallel_tool_calls,
        ),
        pools=pools_for(config.worker_concurrency),
    )


def assemble_runtime(
    config: Config,
    connection: redis.Redis,
    policy: Policy,
    *,
    surfaces: dict[str, Surface] | None = None,
    model: Model | None = None,
    settings: Settings | None = None,
    demos: bool = True,
    per_person_limits: bool = True,
    slack: bool = True,
) -> Runtime:
    """The runtime of `config` with tools already loaded and `policy`. `switchboard eval`
    overrides what it must: its cases' policy and model, a namespace of its own, no
    demonstrations (one of its configurations), no per-person limits (it asks many
    questions as one person), and no Slack (its runs report nowhere)."""
    settings = settings or runtime_settings(config)
    if per_person_limits:  # the policy file's `limits:` over the SWITCHBOARD_USER_* settings
        settings.limits = replace(settings.limits, **policy.limits)  # type: ignore[arg-type]
    else:
        settings.limits = Limits()
    model = model or model_of(config)
    runtime = Runtime(
        redis=connection,
        registry=registry,
        policy=policy,
        model=model,
        settings=settings,
        prices=PriceTable(config.price_table),
        surfaces=dict(surfaces or {}),
    )
    runtime.connections = connections_of(config, connection, settings.namespace)
    embedder = model if isinstance(model, ModelClient) else None  # for embeddings selection
    if demos:
        runtime.demos = build_selector(config, runtime, embedder)
        runtime.profile_demos = build_profile_selectors(config, runtime, embedder)
    if slack and config.slack_bot_token and "slack" not in runtime.surfaces:
        from slack_sdk import WebClient

        from bot.outbound.slack_surface import SlackSurface
        from bot.state.identity import Identity, user_groups

        client = WebClient(token=config.slack_bot_token, base_url=config.slack_api_url)
        runtime.surfaces["slack"] = SlackSurface(client, runtime)
        runtime.roles = Identity(runtime, user_groups(runtime, client)).current_roles
    return runtime


def task_library(config: Config, rt: Runtime) -> TaskLibrary:
    """The task library: SWITCHBOARD_DEMOS, or the shipped one, whose demonstrations use the
    built-in sample tools and so are left out when those are not loaded (they would teach
    the model calls to tools that are not there, or to an operator's tool of the same
    name). Demonstrations saved from runs are kept either way."""
    library = TaskLibrary(rt.redis, config.demos_path, rt.settings.namespace)
    if config.demos_path is None and not config.builtin_tools:
        library.file_demos = []
    return library


def build_selector(config: Config, rt: Runtime, model: ModelClient | None) -> Selector | None:
    """The task library, checked against the registered tools before anything runs."""
    if config.demos_k == 0:
        return None
    library = task_library(config, rt)
    problems = check(library.all(), rt.registry)
    if problems:
        raise DemoError(
            "the task library does not match the tools (run `switchboard demos check`):\n  "
            + "\n  ".join(problems)
        )
    return Selector(
        library,
        config.demos_k,
        embed=embedder(config, rt, model),
        min_score=config.demos_min_score,
        tools=rt.registry,
    )


def build_profile_selectors(
    config: Config, rt: Runtime, model: ModelClient | None, policy: Policy | None = None
) -> dict[str, Selector]:
    """The task library of each profile that names one (`demos:` in the policy file, or in
    `policy`), each checked against the registered tools like the default one."""
    policy = policy or rt.policy
    if config.demos_k == 0:
        return {}
    problems = profile_demo_problems(policy)
    if problems:
        raise DemoError("\n".join(problems))
    return {
        name: Selector(
            TaskLibrary(rt.redis, profile.demos, rt.settings.namespace),
            config.demos_k,
            embed=embedder(config, rt, model),
            min_score=config.demos_min_score,
            tools=rt.registry,
        )
        for name, profile in policy.profiles.items()
        if profile.demos is not None
    }


def profile_demo_problems(policy: Policy) -> list[str]:
    """Every problem with the profiles' task libraries, one line each, naming the policy
    file's line: a file that does not read, a demonstration that does not match the tools."""
    problems: list[str] = []
    for name, profile in policy.profiles.items():
        if profile.demos is None:
            continue
        where = f"{policy.source} line {profile.demos_line}: profiles.{name}.demos"
        try:
            demos = load_file(profile.demos)
        except DemoError as exc:
            problems.append(f"{where}: {' '.join(str(exc).split())}")  # YAML's are multi-line
            continue
        problems += [f"{where}: {problem}" for problem in check(demos, policy.registry)]
    return problems


def embedder(config: Config, rt: Runtime, model: ModelClient | None) -> CachedEmbeddings | None:
    if config.demo_selector != "embeddings":
        return None
    if model is None:
        raise DemoError("SWITCHBOARD_DEMO_SELECTOR=embeddings needs a configured model server")
    return CachedEmbeddings(model, config.embedding_model, rt.redis, rt.settings.namespace)
