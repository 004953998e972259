"""The pages a person opens to connect, in a real headless Chromium (selenium with the
system chromedriver): the Connect URL, the provider's sign-in form (tests/support/
oauth_server.py, the `mcp` SDK's authorization server), and `/oauth/callback` on the bot's
real HTTP server (tests/support/slack_bot.py), with SWITCHBOARD_PUBLIC_URL pointing at it.
The finishing code is read from the page and entered in Slack's modal (a signed
view_submission), as the person would. Then the console's link, which comes back to its
own listener on 127.0.0.1. One browser for the module."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from cryptography.fernet import Fernet

from bot.render.connections import CODE_BLOCK, CODE_INPUT, CODE_MODAL
from tests import test_connections_runs
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.fakes.slack_server import view_submission
from tests.support.oauth_server import OAuthMcpServer
from tests.support.runtime import make_runtime
from tests.support.slack_bot import ALICE, BotEnv
from tests.test_connections import TEAM, people_provider, subject_of, with_connections
from tests.test_console_connect import USER, console_asking
from worker.connections import ConnectionStore
from worker.connections.tokens import Connections
from worker.runtime import Runtime
from worker.service import connections as service

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="needs Chromium and its driver on PATH (Debian: apt-get install chromium "
    "chromium-driver)",
)
people_tool = test_connections_runs.people_tool  # the fixture: a tool that calls `whoami`
HEADLESS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in HEADLESS:
        options.add_argument(flag)
    # the DevTools network log: which requests the pages made, and the headers they got
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def bot(env: BotEnv, provider_server: OAuthMcpServer) -> BotEnv:
    """The bot over HTTP, its public URL its own port (SWITCHBOARD_PUBLIC_URL)."""
    store = ConnectionStore(
        env.rt.redis, env.rt.settings.namespace, [Fernet.generate_key().decode()]
    )
    public = f"http://127.0.0.1:{env.server.port}"
    providers = {"mcp:people": people_provider(provider_server)}
    env.rt.connections = Connections(store, providers, public)
    return env


def network(driver: Any) -> list[dict[str, Any]]:
    """The DevTools network events since the last call (the log is drained as read)."""
    events = [json.loads(entry["message"])["message"] for entry in driver.get_log("performance")]
    return [e for e in events if e["method"].startswith("Network.")]


def responses(events: list[dict[str, Any]], url_prefix: str) -> list[dict[str, Any]]:
    return [
        e["params"]["response"]
        for e in events
        if e["method"] == "Network.responseReceived"
        and e["params"]["response"]["url"].startswith(url_prefix)
    ]


def requested(events: list[dict[str, Any]]) -> list[str]:
    return [
        e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"
    ]


def connection_keys(rt: Runtime) -> dict[bytes, bytes | None]:
    """Every connection key in Redis (grants, flows, held codes, attempts) and its value."""
    conn: redis.Redis = rt.redis
    found = {}
    for pattern in ("conn:*", "conns:*", "oauth:*"):
        for key in conn.scan_iter(match=rt.settings.namespace + pattern, count=1000):
            found[key] = conn.get(key) if conn.type(key) == b"string" else b"other"
    return found


def test_a_person_connects_in_a_browser_and_a_reload_of_the_callback_is_refused(
    browser: Any, bot: BotEnv, provider_server: OAuthMcpServer
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    rt = bot.rt
    assert rt.connections is not None
    callback = rt.connections.public_url + service.CALLBACK_PATH
    network(browser)  # drop what an earlier test left in the log

    browser.get(service.connect_url(rt, TEAM, ALICE, "mcp:people"))  # the Connect button's URL
    WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.ID, "user"))
    assert browser.current_url.startswith(provider_server.base + "/login")
    browser.find_element(By.ID, "user").send_keys("alice")
    browser.find_element(By.ID, "go").click()  # signs in: the provider redirects to us
    WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.ID, "code"))
    assert browser.current_url.startswith(callback + "?")
    code = browser.find_element(By.CSS_SELECTOR, "#code code").text
    assert len(code) == service.CODE_LENGTH and "Enter code" in browser.page_source

    assert_sealed(network(browser), callback, 200)
    assert browser.find_elements(By.CSS_SELECTOR, "script, link, img, iframe, object, [src]") == []

    held = connection_keys(rt)
    browser.refresh()  # the same callback URL again: the back button, a replay
    WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.ID, "why"))
    assert "already used" in browser.find_element(By.ID, "why").text
    assert code not in browser.page_source and browser.find_elements(By.ID, "code") == []
    assert_sealed(network(browser), callback, 400)  # asked for again (no-store), not cached
    assert connection_keys(rt) == held  # the refused reload changed nothing

    # Alice enters the code in Slack's modal; Slack signs that it is her
    values = {CODE_BLOCK: {CODE_INPUT: {"type": "plain_text_input", "value": code}}}
    answer = bot.post(view_submission(CODE_MODAL, values, user_id=ALICE, team_id=TEAM))
    assert answer.status == 200 and '"update"' in answer.body, answer
    token = service.token_for(rt, TEAM, ALICE, "mcp:people")
    assert subject_of(provider_server, token) == "alice"
    assert [c.provider for c in service.listing(rt, TEAM, ALICE)] == ["mcp:people"]


def assert_sealed(events: list[dict[str, Any]], url: str, status: int) -> None:
    """The page at `url` came with `status`, is not cached, refers nowhere, and loaded
    nothing else."""
    [page] = responses(events, url)
    headers = {name.lower(): value for name, value in page["headers"].items()}
    assert page["status"] == status
    assert headers["cache-control"] == "no-store"
    assert headers["referrer-policy"] == "no-referrer"
    assert "default-src 'none'" in headers["content-security-policy"]
    after = requested(events)
    assert after[after.index(page["url"]) + 1 :] == []


def test_the_consoles_link_connects_in_a_browser_on_its_local_port(
    browser: Any,
    redis_conn: redis.Redis,
    model_server: FakeOpenAI,
    provider_server: OAuthMcpServer,
    people_tool: str,
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    model_server.route("who am I at People", [Turn(tool_calls=[(people_tool, {})]), "Done."])
    rt = with_connections(make_runtime(redis_conn, model_server.url), provider_server)
    with console_asking(rt, "who am I at People?\n") as running:
        network(browser)
        browser.get(running.url)  # the link the console printed
        WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.ID, "user"))
        browser.find_element(By.ID, "user").send_keys("dave")
        browser.find_element(By.ID, "go").click()
        WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.ID, "connected"))
        assert browser.current_url.startswith(running.callback + "?")
        assert "People account is connected" in browser.find_element(By.ID, "connected").text
        assert_sealed(network(browser), running.callback, 200)
        running.out.wait_for("Connected your People account")
        assert running.end() == 0
    token = service.token_for(rt, "", USER, "mcp:people")
    assert subject_of(provider_server, token) == "dave"
