"""Clicks per task with and without standing grants (issue 25).

The task: ten similar writes in one thread (`file_note` ten times, the same project, ten
titles), asked once, the model proposing one write per step. The approver decides every
card it gets, as a person would, through the real Bolt app over HTTP (signed requests),
with FakeSlack as the Web API, FakeOpenAI as the model, a private Redis and RQ's
SimpleWorker in this process:

  baseline   every card approved with Approve: one click a card.
  grants     the first card approved with "Approve and allow in this thread" (the click, and
             the modal's submission with `title` ticked to any value: two interactions),
             any later card with Approve.

Counted: the interactions the approver sent (clicks and modal submissions) and the cards
FakeSlack received, per task; and that the ten writes ran, once each, in both modes.

    python bench/bench_grant_clicks.py            # ~15 s
    python bench/bench_grant_clicks.py --writes 20
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import common
import redis
from common import banner, row

from bot.render.blocks import APPROVE
from tests.fakes.openai_server import FakeOpenAI
from tests.support.grants import (
    FILED,
    NOTE_SCHEMA,
    POLICY,
    ask,
    card_for,
    cards,
    declare_note,
    note,
    open_grant,
    submit_grant,
)
from tests.support.slack_bot import CHANNEL, SUPPORT, BotEnv, bot_env
from tools.registry import registry
from worker.run import RunStatus


def one_task(env: BotEnv, word: str, writes: int, grants: bool) -> tuple[int, int]:
    """Run the task to its end, deciding every card; (interactions sent, cards posted)."""
    FILED.clear()
    before = len(cards(env))
    mention = ask(env, f"{word}: file the notes")
    interactions = 0
    decided = 0
    while True:
        run = env.runs()[0]
        if env.rt.store.load(run.id).status.terminal:
            break
        decided += 1
        approval_id, card_ts, _ = card_for(env, before + decided)
        if grants and decided == 1:
            view = open_grant(env, approval_id, card_ts, mention["ts"], "thread", SUPPORT)
            assert view is not None
            assert submit_grant(env, view, SUPPORT, ["title"], ["project", "title"]) is None
            interactions += 2
        else:
            env.click(APPROVE, approval_id, SUPPORT, channel=CHANNEL, message_ts=card_ts)
            interactions += 1
        env.work()
    assert env.rt.store.load(env.runs()[0].id).status == RunStatus.COMPLETED
    assert [f["title"] for f in FILED] == [f"{word}{i}" for i in range(writes)], FILED
    return interactions, len(cards(env)) - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=10, help="writes in the task (10)")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    common.quiet_switchboard_logs()
    banner(f"Clicks per task: {args.writes} similar writes in one thread")
    with (
        tempfile.TemporaryDirectory(prefix="sb-grant-clicks-") as folder,
        common.redis_server(Path(folder)) as url,
    ):
        model = FakeOpenAI().start()
        conn = redis.Redis.from_url(url)
        declare_note(NOTE_SCHEMA)
        figures = {}
        try:
            for mode, word in (("baseline", "plain"), ("grants", "granted")):
                turns = [note(f"{word}{i}") for i in range(args.writes)]
                model.route(word, [*turns, "Filed them all."])
                conn.flushdb()
                tmp = Path(folder) / mode
                tmp.mkdir()
                with bot_env(conn, model.url, tmp, policy=POLICY) as env:
                    common.quiet_switchboard_logs()  # bot_env put structlog's defaults back
                    env.rt.settings.budgets.max_steps = args.writes + 2
                    figures[mode] = one_task(env, word, args.writes, grants=mode == "grants")
        finally:
            registry.unregister("file_note")
            model.stop()
    (base_clicks, base_cards), (grant_clicks, grant_cards) = figures["baseline"], figures["grants"]
    row("without grants: interactions / cards", f"{base_clicks} / {base_cards}")
    row("with one thread grant: interactions / cards", f"{grant_clicks} / {grant_cards}")
    row("interactions, grants vs without", f"{grant_clicks / base_clicks:.2f}x")
    common.dump_json(
        args.json,
        {
            "writes": args.writes,
            "baseline": {"interactions": base_clicks, "cards": base_cards},
            "grants": {"interactions": grant_clicks, "cards": grant_cards},
            "ratio": grant_clicks / base_clicks,
        },
    )


if __name__ == "__main__":
    main()
