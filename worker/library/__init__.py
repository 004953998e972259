"""The task library (the ART idea): solved tasks shown to the model as demonstrations.

A demonstration is a short task description, a question, and the trajectory in native
function-calling form (tool calls with arguments, tool results, the final answer).

- `library`: the demonstration type and the file format (the curated YAML file, checks);
- `store`: `TaskLibrary`, the file plus demonstrations saved in Redis (candidates promoted
  from completed runs wait there until an admin accepts them);
- `candidates`: a completed run as a candidate demonstration;
- `selection`: `Selector`, BM25 over task and question (offline) or embeddings from the
  OpenAI-compatible endpoint; a demonstration that uses a tool the asking user may not call
  is never selected;
- `bm25`: the ranking function BM25 uses.
"""

from worker.library.candidates import candidate_from_run
from worker.library.library import (
    DEFAULT_LIBRARY,
    Call,
    DemoError,
    Demonstration,
    check,
    load_file,
    parse,
)
from worker.library.selection import CachedEmbeddings, Selector
from worker.library.store import TaskLibrary

__all__ = [
    "DEFAULT_LIBRARY",
    "CachedEmbeddings",
    "Call",
    "DemoError",
    "Demonstration",
    "Selector",
    "TaskLibrary",
    "candidate_from_run",
    "check",
    "load_file",
    "parse",
]
