"""While a slow model works, the thread's status message says so and for how long, and a
retry shows there when it starts (issue 23). Bolt over signed HTTP, FakeSlack, the real
openai client against FakeOpenAI, Redis, RQ."""

from __future__ import annotations

from pathlib import Path

from tests.fakes.openai_server import FakeOpenAI, Fault, Script, Turn
from tests.fakes.slack_events import app_mention
from tests.support.slack_bot import ALICE, BotEnv, texts
from worker.model import ModelClient
from worker.run import RunStatus


def test_the_status_message_says_how_long_the_model_has_worked_and_names_a_retry(
    env: BotEnv, model_server: FakeOpenAI, tickets_db: Path
) -> None:
    model_server.route(
        "slow model",
        # silent (given up after 0.6 s), then a slow writer: 40 tokens at 20 a second
        Script([Turn("It is 5. " * 18, pace=20.0)], faults={0: [Fault.slow(3.0)]}),
    )
    assert isinstance(env.rt.model, ModelClient)
    env.rt.model.read_timeout, env.rt.model.watch_every = 0.6, 0.2
    env.rt.settings.model_timeout = 10.0
    before = len(env.runs())
    env.event(app_mention("<@UBOT> a slow model: 2 + 3?", user=ALICE))
    env.wait_for_runs(before + 1)
    env.work()
    [run] = env.runs()
    assert env.rt.store.load(run.id).status == RunStatus.COMPLETED
    shown = [  # everything posted or updated in the thread, streamed answer text included
        texts(c.args.get("blocks") or []) + str(c.args.get("markdown_text") or "")
        for c in env.slack.call_log
        if c.method.startswith("chat.")
    ]
    waiting = [n for n, text in enumerate(shown) if "Waiting for the model (step 1 of 8): " in text]
    assert waiting, shown
    assert any("s of 10 s, attempt 2 of 3" in shown[n] for n in waiting), shown
    answer = next(n for n, text in enumerate(shown) if "It is 5." in text)
    assert waiting[0] < answer  # shown while the model worked, not after
