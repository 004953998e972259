"""The task library (the ART idea): solved tasks shown to the model as demonstrations.

A demonstration is a short task description, a question, and the trajectory in native
function-calling form (tool calls with arguments, tool results, the final answer). The
curated library is a YAML file; candidates promoted from completed runs wait in Redis until
an admin accepts them. Selection is BM25 over task and question (offline), or embeddings from
the OpenAI-compatible endpoint when configured; a demonstration that uses a tool the asking
user may not call is never selected.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import redis
import structlog
import yaml

from tools import ArgumentError, OperatorError, ToolRegistry, canonical_json, decode_arguments
from worker.bm25 import BM25, tokenize
from worker.run import Run, RunStatus

log = structlog.get_logger(__name__)

DEFAULT_LIBRARY = Path(__file__).parent / "data" / "demos.yaml"
MAX_DEMOS = 2000
Status = Literal["accepted", "candidate"]


class DemoError(OperatorError, ValueError):
    """The library does not match the tools; the message names each demonstration."""


@dataclass(frozen=True)
class Call:
    tool: str
    args: dict[str, Any]
    result: str


@dataclass(frozen=True)
class Demonstration:
    id: str
    task: str
    question: str
    steps: tuple[tuple[Call, ...], ...]  # one tuple of calls per model turn
    answer: str
    tags: tuple[str, ...] = ()
    status: Status = "accepted"
    source_run: str | None = None

    @property
    def tools(self) -> set[str]:
        return {call.tool for step in self.steps for call in step}

    @property
    def search_text(self) -> str:
        return " ".join([self.task, self.question, *self.tags])

    def as_messages(self) -> list[dict[str, Any]]:
        """Native function-calling form, as if the model had done it before."""
        messages: list[dict[str, Any]] = [{"role": "user", "content": self.question}]
        for n, step in enumerate(self.steps):
            ids = [f"demo_{_slug(self.id)}_{n}_{i}" for i in range(len(step))]
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": call.tool, "arguments": canonical_json(call.args)},
                        }
                        for call_id, call in zip(ids, step, strict=True)
                    ],
                }
            )
            messages += [
                {"role": "tool", "tool_call_id": call_id, "content": call.result}
                for call_id, call in zip(ids, step, strict=True)
            ]
        messages.append({"role": "assistant", "content": self.answer})
        return messages

    def as_text(self) -> str:
        lines = [f"Task: {self.task}", f"Question: {self.question}"]
        for step in self.steps:
            for call in step:
                lines.append(f"  call {call.tool}({canonical_json(call.args)}) -> {call.result}")
        lines.append(f"Answer: {self.answer}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "task": self.task,
            "question": self.question,
            "tags": list(self.tags),
            "status": self.status,
            "source_run": self.source_run,
            "steps": [
                [{"tool": c.tool, "args": c.args, "result": c.result} for c in step]
                for step in self.steps
            ],
            "answer": self.answer,
        }


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in text)[:40]


def parse(data: dict[str, Any], where: str) -> Demonstration:
    """One demonstration from its YAML/JSON form; errors name it."""
    demo_id = str(data.get("id") or "").strip()
    label = f"{where}: demonstration {demo_id or '(no id)'}"
    if not demo_id:
        raise DemoError(f"{label}: every demonstration needs an id")
    for key in ("task", "question", "answer"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise DemoError(f"{label}: '{key}' must be a non-empty string")
    steps_raw = data.get("steps")
    if not isinstance(steps_raw, list) or not steps_raw:
        raise DemoError(f"{label}: 'steps' must be a list of turns, each a list of calls")
    steps: list[tuple[Call, ...]] = []
    for n, step in enumerate(steps_raw, 1):
        calls = step if isinstance(step, list) else [step]
        parsed: list[Call] = []
        for call in calls:
            if not isinstance(call, dict) or not isinstance(call.get("tool"), str):
                raise DemoError(f"{label}: step {n}: each call needs 'tool', 'args', 'result'")
            args = call.get("args") or {}
            if not isinstance(args, dict):
                raise DemoError(f"{label}: step {n}: 'args' of {call['tool']} must be a mapping")
            result = call.get("result", "")
            text = result if isinstance(result, str) else canonical_json(result)
            parsed.append(Call(call["tool"], args, text))
        steps.append(tuple(parsed))
    status = data.get("status", "accepted")
    if status not in ("accepted", "candidate"):
        raise DemoError(f"{label}: status must be accepted or candidate")
    return Demonstration(
        id=demo_id,
        task=data["task"].strip(),
        question=data["question"].strip(),
        steps=tuple(steps),
        answer=data["answer"].strip(),
        tags=tuple(str(t) for t in data.get("tags") or ()),
        status=status,
        source_run=data.get("source_run"),
    )


def load_file(path: Path) -> list[Demonstration]:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise DemoError(f"{path}: cannot read the task library: {exc}") from exc
    items = raw.get("demonstrations") if isinstance(raw, dict) else raw
    if not isinstance(items, list):
        raise DemoError(f"{path}: expected a list under 'demonstrations:'")
    if len(items) > MAX_DEMOS:
        raise DemoError(f"{path}: {len(items)} demonstrations; the limit is {MAX_DEMOS}")
    demos = [parse(item if isinstance(item, dict) else {}, str(path)) for item in items]
    seen: set[str] = set()
    for demo in demos:
        if demo.id in seen:
            raise DemoError(f"{path}: demonstration {demo.id} appears twice")
        seen.add(demo.id)
    return demos


def check(demos: Iterable[Demonstration], registry: ToolRegistry) -> list[str]:
    """Every problem, one line each, naming the demonstration: a tool that does not exist,
    arguments that do not validate against the tool's schema."""
    problems: list[str] = []
    for demo in demos:
        for n, step in enumerate(demo.steps, 1):
            for call in step:
                tool = registry.get(call.tool)
                if tool is None:
                    problems.append(
                        f"demonstration {demo.id}: step {n} calls {call.tool!r}, which is not a "
                        f"registered tool"
                    )
                    continue
                try:
                    decode_arguments(tool, json.dumps(call.args))
                except ArgumentError as exc:
                    problems.append(f"demonstration {demo.id}: step {n}: {exc}")
    return problems


class TaskLibrary:
    """The curated file plus candidates/accepted demonstrations kept in Redis."""

    def __init__(
        self, connection: redis.Redis, path: Path | None = None, namespace: str = "sb:"
    ) -> None:
        self.redis = connection
        self.path = path or DEFAULT_LIBRARY
        self.ns = namespace
        self.file_demos = load_file(self.path)

    @property
    def stored_key(self) -> str:
        return f"{self.ns}demos:stored"

    @property
    def usage_key(self) -> str:
        return f"{self.ns}demos:usage"

    @property
    def version_key(self) -> str:
        return f"{self.ns}demos:version"

    def version(self) -> int:
        return int(self.redis.get(self.version_key) or 0)

    def stored(self) -> list[Demonstration]:
        raw = self.redis.hgetall(self.stored_key)
        return [parse(json.loads(v), "redis") for _, v in sorted(raw.items())]

    def all(self) -> list[Demonstration]:
        return [*self.file_demos, *self.stored()]

    def accepted(self) -> list[Demonstration]:
        return [d for d in self.all() if d.status == "accepted"]

    def candidates(self) -> list[Demonstration]:
        return [d for d in self.stored() if d.status == "candidate"]

    def get(self, demo_id: str) -> Demonstration | None:
        return next((d for d in self.all() if d.id == demo_id), None)

    def add_candidate(self, demo: Demonstration) -> None:
        """Store a new candidate; of two concurrent saves of one run, one wins."""
        exists = DemoError(f"demonstration {demo.id} already exists")
        if any(d.id == demo.id for d in self.file_demos):
            raise exists
        if not self.redis.hsetnx(self.stored_key, demo.id, json.dumps(demo.to_dict())):
            raise exists
        self.redis.incr(self.version_key)

    def accept(self, demo_id: str, registry: ToolRegistry) -> Demonstration:
        demo = next((d for d in self.candidates() if d.id == demo_id), None)
        if demo is None:
            raise DemoError(f"no candidate demonstration {demo_id!r}")
        problems = check([demo], registry)
        if problems:
            raise DemoError("; ".join(problems))
        accepted = Demonstration(**{**demo.__dict__, "status": "accepted"})
        self._store(accepted)
        return accepted

    def reject(self, demo_id: str) -> bool:
        removed = self.redis.hdel(self.stored_key, demo_id)
        self.redis.incr(self.version_key)
        return bool(removed)

    def _store(self, demo: Demonstration) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.stored_key, demo.id, json.dumps(demo.to_dict()))
        pipe.incr(self.version_key)
        pipe.execute()

    def record_use(self, demos: Sequence[Demonstration]) -> None:
        if demos:
            pipe = self.redis.pipeline(transaction=False)
            for demo in demos:
                pipe.hincrby(self.usage_key, demo.id, 1)
            pipe.execute()

    def usage(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.redis.hgetall(self.usage_key).items()}


def candidate_from_run(run: Run) -> Demonstration:
    """A completed run as a candidate: its successful calls, turn by turn, and its answer."""
    if run.status != RunStatus.COMPLETED or not run.answer:
        raise DemoError(f"run {run.id} is {run.status.value}; only completed runs can be promoted")
    results = {
        m["tool_call_id"]: str(m.get("content") or "")
        for m in run.messages
        if m.get("role") == "tool"
    }
    steps: list[tuple[Call, ...]] = []
    for message in run.messages:
        calls = []
        for tc in message.get("tool_calls") or []:
            result = results.get(tc["id"], "")
            if result.startswith(("Error:", "Not run:", "Outcome unknown")):
                continue
            try:
                args = json.loads(tc["function"]["arguments"] or "{}")
            except json.JSONDecodeError:
                continue
            calls.append(Call(tc["function"]["name"], args, result))
        if calls:
            steps.append(tuple(calls))
    if not steps:
        raise DemoError(f"run {run.id} made no successful tool call; nothing to demonstrate")
    return Demonstration(
        id=f"run-{run.id}",
        task=run.question[:200],
        question=run.question,
        steps=tuple(steps),
        answer=run.answer.split("\n\n_Note:")[0],
        status="candidate",
        source_run=run.id,
    )


@dataclass
class _Index:
    version: int
    demos: list[Demonstration]
    retriever: BM25 | None = None
    vectors: list[list[float]] = field(default_factory=list)


class Selector:
    """Picks `k` accepted demonstrations for a question, among those the user's tools allow."""

    def __init__(
        self,
        library: TaskLibrary,
        k: int = 2,
        *,
        embed: Any = None,  # callable(list[str]) -> list[list[float]]; None = BM25
    ) -> None:
        self.library = library
        self.k = k
        self.embed = embed
        self._index: _Index | None = None
        self._lock = threading.Lock()

    def select(self, question: str, allowed_tools: set[str]) -> list[Demonstration]:
        if self.k <= 0:
            return []
        index = self._current()
        if not index.demos:
            return []
        scores = self._scores(index, question)
        ranked = sorted(range(len(index.demos)), key=lambda i: scores[i], reverse=True)
        chosen = [
            index.demos[i]
            for i in ranked
            if scores[i] > 0 and index.demos[i].tools <= allowed_tools
        ][: self.k]
        self.library.record_use(chosen)
        return chosen

    def lookup(self, ids: list[str]) -> list[Demonstration]:
        """The demonstrations a run was shown at its first step, for its later steps: from the
        index this process already holds, without asking Redis whether the library changed."""
        index = self._index or self._current()
        by_id = {d.id: d for d in index.demos}
        return [by_id[i] for i in ids if i in by_id]

    def _current(self) -> _Index:
        version = self.library.version()
        with self._lock:
            if self._index is None or self._index.version != version:
                self._index = self._build(version)
            return self._index

    def _build(self, version: int) -> _Index:
        demos = self.library.accepted()
        index = _Index(version, demos)
        if not demos:
            return index
        texts = [d.search_text for d in demos]
        if self.embed is not None:
            index.vectors = self.embed(texts)
        else:
            index.retriever = BM25([tokenize(text) for text in texts])
        return index

    def _scores(self, index: _Index, question: str) -> list[float]:
        if self.embed is not None:
            [query] = self.embed([question])
            return [_cosine(query, v) for v in index.vectors]
        assert index.retriever is not None
        return index.retriever.scores(tokenize(question))


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


class CachedEmbeddings:
    """Embeddings through the OpenAI-compatible endpoint, cached in Redis by text hash."""

    def __init__(self, client: Any, model: str, connection: redis.Redis, namespace: str = "sb:"):
        self.client = client
        self.model = model
        self.redis = connection
        self.ns = namespace

    def __call__(self, texts: list[str]) -> list[list[float]]:
        keys = [
            f"{self.ns}emb:{hashlib.sha256((self.model + chr(0) + t).encode()).hexdigest()[:32]}"
            for t in texts
        ]
        cached = self.redis.mget(keys)
        missing = [i for i, value in enumerate(cached) if value is None]
        vectors: list[list[float] | None] = [
            json.loads(value) if value is not None else None for value in cached
        ]
        if missing:
            response = self.client.embeddings.create(
                model=self.model, input=[texts[i] for i in missing]
            )
            pipe = self.redis.pipeline(transaction=False)
            for i, item in zip(missing, response.data, strict=True):
                vectors[i] = list(item.embedding)
                pipe.set(keys[i], json.dumps(vectors[i]), ex=30 * 86400)
            pipe.execute()
        return [v or [] for v in vectors]
