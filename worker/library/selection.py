"""Choosing demonstrations for a question: BM25 over task and question (offline), or
embeddings from the OpenAI-compatible endpoint (cached in Redis).

A demonstration is shown only when it fits: every tool it calls is one the asking person may
call; it is relevant enough (`min_score`: BM25 as a share of a perfect match, or the cosine
similarity of the embeddings), so a question no demonstration is about gets none rather than
an unrelated one; and a demonstration that writes is shown only to a question that asks for
that action (worker/library/actions.py). A model copies what it is shown.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from tools.registry import ToolRegistry, registry
from worker.keys import Keys
from worker.library.actions import asks_for
from worker.library.bm25 import BM25, tokenize
from worker.library.library import Demonstration
from worker.library.store import TaskLibrary


@dataclass
class _Index:
    version: int
    demos: list[Demonstration]
    retriever: BM25 | None = None
    vectors: list[list[float]] = field(default_factory=list)


MIN_SCORE = 0.2  # SWITCHBOARD_DEMOS_MIN_SCORE's default (README.md, "The task library")


@dataclass(frozen=True)
class Candidate:
    demo: Demonstration
    score: float
    why: str = ""  # why it was left out; "" when chosen


@dataclass(frozen=True)
class Selection:
    """The demonstrations chosen for a question, best first, and those left out, best first."""

    chosen: list[Candidate] = field(default_factory=list)
    dropped: list[Candidate] = field(default_factory=list)

    @property
    def demos(self) -> list[Demonstration]:
        return [c.demo for c in self.chosen]

    def record(self) -> dict[str, Any]:
        """What the run's `demos_selected` event keeps: each chosen one's score, and the best
        one left out (its score and why), to tell a close call from no contest."""
        best = next(iter(self.dropped), None)
        return {
            "scores": {c.demo.id: round(c.score, 3) for c in self.chosen},
            "rejected": (
                {"id": best.demo.id, "score": round(best.score, 3), "why": best.why}
                if best is not None
                else None
            ),
        }


class Selector:
    """Picks up to `k` accepted demonstrations that fit a question (see the module's docstring)."""

    def __init__(
        self,
        library: TaskLibrary,
        k: int = 2,
        *,
        embed: Any = None,  # callable(list[str]) -> list[list[float]]; None = BM25
        min_score: float = MIN_SCORE,
        tools: ToolRegistry = registry,  # whether a demonstration's tools write
    ) -> None:
        self.library = library
        self.k = k
        self.embed = embed
        self.min_score = min_score
        self.tools = tools
        self._index: _Index | None = None
        self._lock = threading.Lock()

    def select(self, question: str, allowed_tools: set[str]) -> list[Demonstration]:
        return self.choose(question, allowed_tools).demos

    def choose(self, question: str, allowed_tools: set[str], *, record: bool = True) -> Selection:
        """The demonstrations for `question` and why the others were left out; `record`
        counts the chosen ones' use (not for `switchboard demos check --questions`)."""
        if self.k <= 0:
            return Selection()
        index = self._current()
        if not index.demos:
            return Selection()
        scores = self._scores(index, question)
        ranked = sorted(range(len(index.demos)), key=lambda i: scores[i], reverse=True)
        chosen: list[Candidate] = []
        dropped: list[Candidate] = []
        for i in ranked:
            demo, score = index.demos[i], scores[i]
            why = self._unfit(demo, score, question, allowed_tools)
            if not why and len(chosen) >= self.k:
                why = f"not among the best {self.k}"
            (dropped if why else chosen).append(Candidate(demo, score, why))
        if record:
            self.library.record_use([c.demo for c in chosen])
        return Selection(chosen, dropped)

    def _unfit(self, demo: Demonstration, score: float, question: str, allowed: set[str]) -> str:
        """Why `demo` must not be shown for `question` ("" when it may)."""
        barred = sorted(demo.tools - allowed)
        if barred:
            return f"calls {', '.join(barred)}, which the person may not call"
        if score <= 0 or score < self.min_score:
            return f"below the relevance floor ({score:.2f} < {self.min_score:.2f})"
        unasked = [t for t in sorted(demo.tools) if self._writes(t) and not asks_for(question, t)]
        if unasked:
            return f"writes with {', '.join(unasked)}, which the question does not ask for"
        return ""

    def _writes(self, tool: str) -> bool:
        found = self.tools.get(tool)
        return found is None or found.effect != "read"  # unknown: as careful as a write

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
        return index.retriever.relevance(tokenize(question))


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
        self.keys = Keys(namespace)

    def __call__(self, texts: list[str]) -> list[list[float]]:
        keys = [
            self.keys.embedding(hashlib.sha256((self.model + chr(0) + t).encode()).hexdigest()[:32])
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
