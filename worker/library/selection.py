"""Choosing demonstrations for a question: BM25 over task and question (offline), or
embeddings from the OpenAI-compatible endpoint (cached in Redis)."""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from worker.keys import Keys
from worker.library.bm25 import BM25, tokenize
from worker.library.library import Demonstration
from worker.library.store import TaskLibrary


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
