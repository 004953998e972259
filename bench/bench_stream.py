"""Time to the first words of the answer in Slack: streamed vs posted at the end (issue 11).

The model writes at 50 tokens a second (tests/fakes' FakeOpenAI with `pace=50`: the answer in
4-character tokens, one server-sent event each, 20 ms apart); the question is answered in one
step (no tools), so the time is the model's. Slack is FakeSlack over HTTP with the real
slack_sdk; it records when each message first showed text (`first_text_at`). A run is timed from
`service.submit` to the moment the answer message first showed text:

  streamed   SWITCHBOARD_STREAM_ANSWERS on (the default): chat.startStream once the first
             words are in, appends while the model writes, stopStream with the footer.
  posted     streaming off: the answer is posted whole (chat.postMessage) when the model is done.

Both modes run in this process against one Redis, one in-process RQ SimpleWorker, alternating
run by run; the figure is the ratio of the medians, measured in the same run.

    python bench/bench_stream.py            # 5 runs of each, ~25 s
    python bench/bench_stream.py -n 10 --tokens 150
"""

from __future__ import annotations

import argparse
import itertools
import time

import common
import redis
from common import banner, median, row
from slack_sdk import WebClient

from bot.outbound.slack_surface import SlackSurface
from bot.render.blocks import VIEW_RUN
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.fakes.slack_server import FakeSlack, next_ts
from tests.support.runtime import ALICE, make_runtime, work
from worker import service
from worker.run import RunStatus
from worker.runtime import Runtime

PACE = 50.0  # tokens a second
CHANNEL = "C0BENCH"
SENTENCE = "Python Basics comes first, then Django Fundamentals builds on it step by step. "


def answer_of(tokens: int) -> str:
    """About `tokens` tokens of answer text (the fake cuts it in 4-character tokens)."""
    text = "".join(itertools.islice(itertools.cycle(SENTENCE), tokens * 4))
    return text.strip() + "."


def first_words(slack: FakeSlack, thread_ts: str) -> float:
    """When the answer message of the thread first showed text (monotonic)."""
    for message in slack.thread(CHANNEL, thread_ts):
        if VIEW_RUN in str(message.get("blocks")):
            at = slack.first_text_at(str(message["ts"]))
            assert at is not None
            return at
    raise AssertionError("no answer in the thread")


def one_run(rt: Runtime, slack: FakeSlack, question: str, *, stream: bool) -> float:
    rt.settings.stream_answers = stream
    thread_ts = next_ts()
    origin = {"surface": "slack", "channel": CHANNEL, "thread_ts": thread_ts, "team": "T0001"}
    started = time.monotonic()
    run = service.submit(rt, question, ALICE, origin=origin)
    work(rt)
    done = rt.store.load(run.id)
    assert done.status == RunStatus.COMPLETED, (done.status, done.detail)
    return first_words(slack, thread_ts) - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5, help="runs of each mode")
    parser.add_argument("--tokens", type=int, default=100, help="answer length in tokens")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()

    banner("time to the first words of the answer in Slack: streamed / posted at the end")
    common.quiet_switchboard_logs()
    question = "What comes before Django Fundamentals?"
    with (
        common.workdir("sb-bench-stream-") as folder,
        common.redis_server(folder) as url,
        FakeOpenAI(pace=PACE) as model,
        FakeSlack() as slack,
    ):
        model.route("Django", [Turn(answer_of(args.tokens))])
        conn = redis.Redis.from_url(url)
        rt = make_runtime(conn, model.url)
        surface = SlackSurface(WebClient(token="xoxb-bench", base_url=slack.url), rt)
        rt.surfaces["slack"] = surface
        one_run(rt, slack, question, stream=True)  # warm-up: imports, connections
        one_run(rt, slack, question, stream=False)
        times: dict[str, list[float]] = {"streamed": [], "posted": []}
        for _ in range(args.n):
            times["streamed"].append(one_run(rt, slack, question, stream=True))
            times["posted"].append(one_run(rt, slack, question, stream=False))
        surface.close()

    streamed, posted = median(times["streamed"]), median(times["posted"])
    row("answer", f"{args.tokens} tokens at {PACE:g} tokens/s, one step, {args.n} runs each")
    row("streamed: first words visible (median)", f"{streamed * 1000:.0f} ms")
    row("posted at the end: answer visible (median)", f"{posted * 1000:.0f} ms")
    row("ratio streamed / posted", f"{streamed / posted:.2f}x")
    common.dump_json(
        args.json,
        {
            "tokens": args.tokens,
            "pace": PACE,
            "runs": args.n,
            "streamed_s": times["streamed"],
            "posted_s": times["posted"],
            "ratio": streamed / posted,
        },
    )


if __name__ == "__main__":
    main()
