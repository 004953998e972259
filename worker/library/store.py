"""`TaskLibrary`: the curated file plus demonstrations saved in Redis (candidates promoted
from completed runs, and those an admin accepted), with how often each was shown."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import redis

from tools.registry import ToolRegistry
from worker.keys import Keys
from worker.library.library import (
    DEFAULT_LIBRARY,
    DemoError,
    Demonstration,
    check,
    load_file,
    parse,
)


class TaskLibrary:
    """The curated file plus candidates/accepted demonstrations kept in Redis."""

    def __init__(
        self, connection: redis.Redis, path: Path | None = None, namespace: str = "sb:"
    ) -> None:
        self.redis = connection
        self.path = path or DEFAULT_LIBRARY
        self.ns = namespace
        self.keys = Keys(namespace)
        self.file_demos = load_file(self.path)

    def version(self) -> int:
        return int(self.redis.get(self.keys.demos_version) or 0)

    def stored(self) -> list[Demonstration]:
        raw = self.redis.hgetall(self.keys.demos_stored)
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
        if not self.redis.hsetnx(self.keys.demos_stored, demo.id, json.dumps(demo.to_dict())):
            raise exists
        self.redis.incr(self.keys.demos_version)

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
        removed = self.redis.hdel(self.keys.demos_stored, demo_id)
        self.redis.incr(self.keys.demos_version)
        return bool(removed)

    def _store(self, demo: Demonstration) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.keys.demos_stored, demo.id, json.dumps(demo.to_dict()))
        pipe.incr(self.keys.demos_version)
        pipe.execute()

    def record_use(self, demos: Sequence[Demonstration]) -> None:
        if demos:
            pipe = self.redis.pipeline(transaction=False)
            for demo in demos:
                pipe.hincrby(self.keys.demos_usage, demo.id, 1)
            pipe.execute()

    def usage(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.redis.hgetall(self.keys.demos_usage).items()}
