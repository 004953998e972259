"""Time to the first visible sign that a slow model is working: streamed vs not (issue 23).

The model writes at 30 tokens a second (FakeOpenAI `pace=30`: the answer in 4-character
tokens, one server-sent event each); the question is answered in one step (no tools). A run is
timed from `service.submit` to the first thing the surface is given *about the model's reply*
after the step's "Thinking" line (which both modes show at once, before the model is asked):

  streamed   SWITCHBOARD_STREAM_ANSWERS on: the first words of the answer (the surface's
             answer stream), as the model writes them.
  whole      streaming off: the first "Waiting for the model (…): N s of 60 s" status
             (worker/model_watch.py, every 5 s while the call runs), or the answer, if sooner.

Also shown: when the whole answer arrives in each mode, and the longest the surface went
without anything new during the step (its longest silence). The surface is an in-process
recorder of what the runtime hands a surface (Slack's own throttling is bench_stream.py's
subject); one Redis, one in-process RQ SimpleWorker, the modes alternating run by run; the
figure is the ratio of the medians, measured in the same run.

    python bench/bench_first_progress.py            # 3 runs of each, ~70 s
    python bench/bench_first_progress.py -n 5 --tokens 150
"""

from __future__ import annotations

import argparse
import itertools
import time

import common
import redis
from common import banner, median, row

from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.support.runtime import ALICE, make_runtime, work
from worker import service
from worker.model import ModelClient
from worker.run import Run, RunStatus
from worker.runtime import Runtime
from worker.surface import SilentSurface

PACE = 30.0  # tokens a second: a small local model on a busy CPU
SENTENCE = "Python Basics comes first, then Django Fundamentals builds on it step by step. "


class Timeline(SilentSurface):
    """What the runtime shows a surface, with when (monotonic): status lines, answer text."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, str, str]] = []
        self.stream = True

    def progress(self, run: Run, text: str) -> None:
        self.seen.append((time.monotonic(), "status", text))

    def answer_stream(self, run: Run) -> Timeline | None:
        return self if self.stream else None

    def text(self, delta: str) -> None:
        self.seen.append((time.monotonic(), "text", delta))

    def reset(self) -> None:
        self.seen.append((time.monotonic(), "reset", ""))

    def finished(self, run: Run) -> None:
        self.seen.append((time.monotonic(), "answer", run.answer or ""))


def answer_of(tokens: int) -> str:
    text = "".join(itertools.islice(itertools.cycle(SENTENCE), tokens * 4))
    return text.strip() + "."


def one_run(rt: Runtime, surface: Timeline, question: str, *, stream: bool) -> dict[str, float]:
    rt.settings.stream_answers = surface.stream = stream
    surface.seen.clear()
    started = time.monotonic()
    run = service.submit(rt, question, ALICE, origin={"surface": "timeline"})
    work(rt)
    done = rt.store.load(run.id)
    assert done.status == RunStatus.COMPLETED, (done.status, done.detail)
    about_reply = [
        at
        for at, kind, text in surface.seen
        if kind in ("text", "answer") or text.startswith("Waiting for the model")
    ]
    answer = next(at for at, kind, _ in surface.seen if kind == "answer")
    moments = [started, *(at for at, _, _ in surface.seen)]
    return {
        "first": about_reply[0] - started,
        "answer": answer - started,
        "silence": max(b - a for a, b in itertools.pairwise(moments)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=3, help="runs of each mode")
    parser.add_argument("--tokens", type=int, default=300, help="answer length in tokens")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()

    banner("time to the first visible progress of a slow model: streamed / whole")
    common.quiet_switchboard_logs()
    question = "What comes before Django Fundamentals?"
    with (
        common.workdir("sb-bench-progress-") as folder,
        common.redis_server(folder) as url,
        FakeOpenAI(pace=PACE) as model,
    ):
        model.route("Django", [Turn(answer_of(args.tokens))])
        rt = make_runtime(redis.Redis.from_url(url), model.url, model_timeout=60.0)
        assert isinstance(rt.model, ModelClient)
        every = rt.model.watch_every
        surface = Timeline()
        rt.surfaces["timeline"] = surface
        runs: dict[str, list[dict[str, float]]] = {"streamed": [], "whole": []}
        for _ in range(args.n):
            runs["streamed"].append(one_run(rt, surface, question, stream=True))
            runs["whole"].append(one_run(rt, surface, question, stream=False))

    def med(mode: str, figure: str) -> float:
        return median([r[figure] for r in runs[mode]])

    streamed, whole = med("streamed", "first"), med("whole", "first")
    row("answer", f"{args.tokens} tokens at {PACE:g} tokens/s, one step, {args.n} runs each")
    row("streamed: first words visible (median)", f"{streamed * 1000:.0f} ms")
    row(f"whole: first status (every {every:g} s) (median)", f"{whole * 1000:.0f} ms")
    row("ratio streamed / whole", f"{streamed / whole:.3f}x")
    answer = med("whole", "answer")  # what a person saw first before the status said more
    row("whole, without the waiting status: answer", f"{answer * 1000:.0f} ms")
    row("ratio first status / answer (whole)", f"{whole / answer:.2f}x")
    for mode in ("streamed", "whole"):
        row(f"{mode}: whole answer at (median)", f"{med(mode, 'answer'):.2f} s")
        row(f"{mode}: longest silence on the surface", f"{med(mode, 'silence'):.2f} s")
    common.dump_json(
        args.json,
        {
            "tokens": args.tokens,
            "pace": PACE,
            "runs": runs,
            "watch_every_s": every,
            "ratio_first_progress": streamed / whole,
        },
    )


if __name__ == "__main__":
    main()
