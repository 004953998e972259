"""Real parts, not mocks: a real Redis (private unless REDIS_URL is set), real RQ workers,
the real openai client against a local fake server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis
import structlog
from hypothesis import settings

from tests.fakes.openai_server import FakeOpenAI
from tests.support.mcp_servers import NotesServer

if TYPE_CHECKING:
    from tests.support.oauth_server import OAuthMcpServer
    from tests.support.slack_bot import BotEnv
from tests.support.redis_server import RedisServer

# Property tests check what is accepted, not how fast: on two shared cores a first example is
# slow now and then, so none has a deadline (a failure seen once on a fresh venv, likely that).
# A test that sets its own settings keeps them; the rest of the defaults hold.
settings.register_profile("switchboard", deadline=None)
settings.load_profile("switchboard")


# Opt-in: run only when `-m` names them, never with the rest (`pytest`, `-m "not slow"`).
# `llama_server` needs a real model server (OPENAI_BASE_URL).
OPT_IN_MARKERS = ("llama_server",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    asked = config.getoption("markexpr") or ""
    skipped = [m for m in OPT_IN_MARKERS if m not in asked]
    deselected = [item for item in items if any(m in item.keywords for m in skipped)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto` (addopts): a test process per core (xdist's count), but one in all when
    REDIS_URL names the Redis: each test flushes its database and some read the server's own
    counters, which a second process would change under them."""
    return 0 if os.environ.get("REDIS_URL") else None


@pytest.fixture(scope="session")
def data_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data-home")


@pytest.fixture(autouse=True)
def _own_data_home(data_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing a test does is kept in the home folder, nor shared with another test process:
    what the app keeps in XDG_DATA_HOME by default (the tickets tool's database, say) goes to
    a folder of this test process's, where the test gives it no folder of its own."""
    monkeypatch.setenv("XDG_DATA_HOME", str(data_home))


@pytest.fixture(autouse=True)
def _structlog_defaults() -> None:
    """Every test starts from structlog's defaults: a CLI command run earlier in this
    process configures a level filter (and cached loggers) that `capture_logs` keeps, so
    lines a test looks for would be dropped depending on which tests ran before it."""
    structlog.reset_defaults()


@pytest.fixture(scope="module")
def provider_server() -> Iterator[OAuthMcpServer]:
    """A real OAuth 2.1 authorization server (the `mcp` SDK's) in front of an MCP server:
    the provider of per-user connections (tests/support/oauth_server.py)."""
    from tests.support.oauth_server import OAuthMcpServer

    server = OAuthMcpServer()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """REDIS_URL when set (a disposable test database: it is flushed), else a private server."""
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server.url
    server.stop()


@pytest.fixture
def redis_conn(redis_url: str) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(redis_url)
    conn.flushdb()
    yield conn
    conn.close()


# What an operator may have set that would change what a `switchboard` command does in a test
OPERATOR_SETTINGS = (
    *("SWITCHBOARD_POLICY", "SWITCHBOARD_TOOLS", "SWITCHBOARD_MCP", "SWITCHBOARD_DEMOS"),
    *("SWITCHBOARD_INSTRUCTIONS", "OPENAI_API_KEY", "OPENAI_BASE_URL"),
)


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, redis_url: str, tmp_path: Path) -> None:
    """The environment of a `switchboard` command run in the test's process: the test's
    Redis, a data folder of its own, none of the operator's settings, no .env file."""
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    for name in OPERATOR_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # no .env file here


@pytest.fixture(scope="session")
def fake_openai() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def model_server(fake_openai: FakeOpenAI) -> FakeOpenAI:
    fake_openai.reset()
    return fake_openai


@pytest.fixture
def tickets_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "tickets.sqlite3"
    monkeypatch.setenv("SWITCHBOARD_TICKETS_DB", str(path))
    return path


@pytest.fixture
def env(
    redis_conn: redis.Redis, model_server: FakeOpenAI, tickets_db: Path, tmp_path: Path
) -> Iterator[BotEnv]:
    """The Slack bot served over HTTP against FakeSlack (see tests/support/slack_bot.py)."""
    from tests.support.slack_bot import bot_env

    with bot_env(redis_conn, model_server.url, tmp_path) as bot:
        yield bot


@pytest.fixture
def notes_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where tests/support/mcp_server.py keeps its notes and counts its writes (NOTES_DIR)."""
    folder = tmp_path / "notes"
    folder.mkdir()
    monkeypatch.setenv("NOTES_DIR", str(folder))
    return folder


@pytest.fixture
def notes_http(notes_dir: Path) -> Iterator[NotesServer]:
    """tests/support/mcp_server.py over streamable HTTP on 127.0.0.1 (tests/support/mcp_servers)."""
    server = NotesServer(notes_dir)
    yield server
    server.stop()
