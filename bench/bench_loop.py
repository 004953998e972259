"""Loop overhead: Switchboard vs the openai-agents SDK on the same 4-step task.

The task: "What is the total fee for Django Fundamentals and its prerequisite course?" —
two knowledge_lookup calls, one calculate, then the answer — against a zero-latency fake
model over HTTP (tests/fakes' FakeOpenAI in its own process, TCP_NODELAY on, so neither
side pays a 40 ms delayed ACK). Both sides use the real `openai` client over loopback.

  Switchboard  service.submit (run document, indexes, event, RQ enqueue) and an in-process
               RQ SimpleWorker running `worker.jobs.advance`: lease, model call, tool
               validation/authorization, reads (each handler in a thread), the run saved and events
               appended in Redis after every step, grounding check. Default policy and the
               six built-in tools; no demonstrations (make_runtime, as the tests build it).
  agents       `Runner.run_sync` of the openai-agents SDK, OpenAIChatCompletionsModel with an
               AsyncOpenAI client pointed at the same fake, tracing disabled, the same
               instructions and the same six tools (knowledge_lookup and calculate are the
               built-in functions wrapped with @function_tool; the four ticket tools are
               declared with Switchboard's own schemas and never called).

Two ways to run the Switchboard worker, both measured, both interleaved with the agents SDK
in A/B batches after a warm-up (per-run times, median):

  resident  one SimpleWorker, started once, working in this process's main thread (as a
            `switchboard worker` does); a run is timed from service.submit until the worker
            has finished the RQ job (result saved, registries updated). HEADLINE.
  burst     service.submit then `SimpleWorker.work(burst=True)` for each run (as the tests
            do): also pays RQ's worker start-up and teardown every run (register birth,
            pubsub subscribe, register death, join the pubsub thread).

    python bench/bench_loop.py                 # 200 runs of each side per mode
    python bench/bench_loop.py -n 400 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import common
import redis
from common import FEE_QUESTION, FakeModelProcess, median, percentile, row
from rq import SimpleWorker
from rq.serializers import JSONSerializer

from tests.support.runtime import ALICE, make_runtime, work
from worker import service
from worker.prompt import INSTRUCTIONS
from worker.run import RunStatus
from worker.runtime import Runtime

TARGET = 1.0


# --- the openai-agents side ---------------------------------------------------------------


def build_agent(rt: Any, model_url: str) -> Any:
    """The openai-agents equivalent of Switchboard's runtime `rt` (only its policy and tool
    registry are used: the same tools, schemas and instructions)."""
    from agents import (
        Agent,
        FunctionTool,
        ModelSettings,
        OpenAIChatCompletionsModel,
        function_tool,
        set_tracing_disabled,
    )
    from latency_peer import knowledge_lookup  # the tool without its ToolContext, as peers see it
    from openai import AsyncOpenAI

    from tools.builtin.calculator import calculate

    set_tracing_disabled(True)
    typed = {"knowledge_lookup": knowledge_lookup, "calculate": calculate}
    tools: list[Any] = []
    for name in rt.policy.allowed_tools(frozenset(ALICE.roles)):
        spec = rt.registry.get(name).openai_spec()["function"]
        if name in typed:
            tools.append(
                function_tool(
                    typed[name], name_override=name, description_override=spec["description"]
                )
            )
        else:

            async def never(_ctx: Any, _args: str, name: str = name) -> str:
                raise AssertionError(f"the script never calls {name}")

            tools.append(
                FunctionTool(
                    name=name,
                    description=spec["description"],
                    params_json_schema=spec["parameters"],
                    on_invoke_tool=never,
                    strict_json_schema=bool(spec.get("strict")),
                )
            )
    client = AsyncOpenAI(base_url=model_url, api_key="test", max_retries=2)
    return Agent(
        name="Switchboard",
        instructions=INSTRUCTIONS.format(user_id=ALICE.user_id),
        model=OpenAIChatCompletionsModel(model="gpt-fake", openai_client=client),
        model_settings=ModelSettings(parallel_tool_calls=True),
        tools=tools,
    )


def agents_run(agent: Any) -> Callable[[], float]:
    from agents import Runner

    def one() -> float:
        started = time.perf_counter()
        result = Runner.run_sync(agent, FEE_QUESTION)
        elapsed = time.perf_counter() - started
        assert "4998" in str(result.final_output), result.final_output
        return elapsed

    return one


# --- the Switchboard side --------------------------------------------------------------------


class ResidentWorker(SimpleWorker):
    """A SimpleWorker that tells the timing thread when each job is completely done."""

    job_done = threading.Event()

    def execute_job(self, job: Any, queue: Any) -> None:
        super().execute_job(job, queue)
        self.job_done.set()


def switchboard_resident(rt: Runtime) -> Callable[[], float]:
    def one() -> float:
        ResidentWorker.job_done.clear()
        started = time.perf_counter()
        run = service.submit(rt, FEE_QUESTION, ALICE)
        if not ResidentWorker.job_done.wait(30):
            raise TimeoutError("the resident worker did not finish the run")
        elapsed = time.perf_counter() - started
        check_completed(rt, run.id)
        return elapsed

    return one


def switchboard_burst(rt: Runtime) -> Callable[[], float]:
    def one() -> float:
        started = time.perf_counter()
        run = service.submit(rt, FEE_QUESTION, ALICE)
        work(rt)
        elapsed = time.perf_counter() - started
        check_completed(rt, run.id)
        return elapsed

    return one


_checked = 0


def check_completed(rt: Runtime, run_id: str) -> None:
    """Every 25th run is read back (outside the timed part): it must have completed right."""
    global _checked
    _checked += 1
    if _checked % 25 == 1:
        run = rt.store.load(run_id)
        assert run.status == RunStatus.COMPLETED and "4998" in (run.answer or ""), run.detail
        assert run.usage.steps == 4 and run.usage.tool_calls == 3


# --- measuring -------------------------------------------------------------------------------


def interleaved(
    a: Callable[[], float], b: Callable[[], float], n: int, batch: int, warmup: int
) -> tuple[list[float], list[float]]:
    """Warm up both, then alternate batches A B B A A B ... until each has n timed runs."""
    for _ in range(warmup):
        a()
        b()
    times_a: list[float] = []
    times_b: list[float] = []
    flip = False
    while len(times_a) < n:
        size = min(batch, n - len(times_a))
        order = [(a, times_a), (b, times_b)]
        for fn, sink in reversed(order) if flip else order:
            sink.extend(fn() for _ in range(size))
        flip = not flip
    return times_a, times_b


def report(mode: str, sb: list[float], ag: list[float]) -> dict[str, float]:
    sb_ms, ag_ms = median(sb) * 1000, median(ag) * 1000
    ratio = sb_ms / ag_ms
    row(
        f"[{mode}] Switchboard median per run",
        f"{sb_ms:7.2f} ms  (p90 {percentile(sb, 90) * 1000:.2f})",
    )
    row(
        f"[{mode}] openai-agents median per run",
        f"{ag_ms:7.2f} ms  (p90 {percentile(ag, 90) * 1000:.2f})",
    )
    row(f"[{mode}] ratio Switchboard / agents", f"{ratio:5.2f}x   target <= {TARGET:.1f}x")
    return {"switchboard_ms": sb_ms, "agents_ms": ag_ms, "ratio": ratio}


def run_resident(
    rt: Runtime, model_url: str, args: argparse.Namespace
) -> tuple[list[float], list[float]]:
    """The worker owns the main thread (RQ's job timeout uses SIGALRM); timing runs beside it.
    The agent (and its AsyncOpenAI client) is built in the timing thread: asyncio connection
    pools belong to the event loop of the thread that made them."""
    total_jobs = args.warmup + args.n
    outcome: dict[str, Any] = {}

    def driver() -> None:
        try:
            agent = build_agent(rt, model_url)
            outcome["times"] = interleaved(
                switchboard_resident(rt), agents_run(agent), args.n, args.batch, args.warmup
            )
        except BaseException as exc:  # shown by the main thread
            outcome["error"] = exc
            traceback.print_exc()
            os.kill(os.getpid(), signal.SIGTERM)  # RQ's warm shutdown ends work()

    worker = ResidentWorker(
        [rt.queue],
        connection=rt.redis,
        serializer=JSONSerializer,
        worker_ttl=60,
        maintenance_interval=60,
    )
    thread = threading.Thread(target=driver, name="bench-driver", daemon=True)
    thread.start()
    worker.work(max_jobs=total_jobs, logging_level="WARNING")
    thread.join(60)
    if "error" in outcome:
        raise RuntimeError("the resident measurement failed") from outcome["error"]
    return outcome["times"]


def profile(rt: Runtime, agent: Any, runs: int) -> None:
    """cProfile of each side (burst mode for Switchboard: one thread, one profile)."""
    sb, ag = switchboard_burst(rt), agents_run(agent)
    for label, fn in (("Switchboard (burst)", sb), ("openai-agents", ag)):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(runs):
            fn()
        prof.disable()
        out = io.StringIO()
        stats = pstats.Stats(prof, stream=out)
        stats.sort_stats("cumulative").print_stats(35)
        print(f"\n--- profile: {label}, {runs} runs (cumulative) ---")
        print("\n".join(out.getvalue().splitlines()[:60]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=200, help="timed runs per side per mode")
    parser.add_argument("--batch", type=int, default=20, help="runs per A/B batch")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--mode", choices=["both", "resident", "burst"], default="both")
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of each")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()

    common.banner("bench_loop: loop overhead, 4-step task, zero-latency fake model over HTTP")
    common.quiet_switchboard_logs()
    figures: dict[str, Any] = {}
    with common.workdir("bench-loop-") as tmp, common.redis_server(tmp) as url:
        os.environ["SWITCHBOARD_TICKETS_DB"] = str(tmp / "tickets.sqlite3")
        fake = FakeModelProcess()
        try:
            conn = redis.Redis.from_url(url)
            rt = make_runtime(conn, fake.url)
            agent = build_agent(rt, fake.url)
            row(
                "runs per side per mode",
                f"{args.n} (after {args.warmup} warm-up), batches of {args.batch}",
            )
            if args.mode in ("both", "burst"):
                sb, ag = interleaved(
                    switchboard_burst(rt), agents_run(agent), args.n, args.batch, args.warmup
                )
                figures["burst"] = report("burst", sb, ag)
            if args.mode in ("both", "resident"):
                sb, ag = run_resident(rt, fake.url, args)
                figures["resident"] = report("resident", sb, ag)
            if args.profile:
                profile(rt, agent, 100)
        finally:
            fake.stop()
    headline = figures.get("resident") or figures["burst"]
    print(
        f"RESULT loop overhead: Switchboard/agents = {headline['ratio']:.2f}x "
        f"(target <= {TARGET:.1f}x: {common.verdict(headline['ratio'] <= TARGET)})"
    )
    common.dump_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
