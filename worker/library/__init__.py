"""The task library (the ART idea): solved tasks shown to the model as demonstrations.

A demonstration is a short task description, a question, and the trajectory in native
function-calling form (tool calls with arguments, tool results, the final answer).

- `library`: the demonstration type and the file format (the curated YAML file, checks);
- `store`: `TaskLibrary`, the file plus demonstrations saved in Redis (candidates promoted
  from completed runs wait there until an admin accepts them);
- `candidates`: a completed run as a candidate demonstration;
- `selection`: `Selector`, BM25 over task and question (offline) or embeddings from the
  OpenAI-compatible endpoint; a demonstration that uses a tool the asking user may not call,
  that is less relevant than the floor, or that writes when the question does not ask for
  it is never selected;
- `actions`: whether a question asks for what a write tool does;
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
from worker.library.selection import CachedEmbeddings, Candidate, Selection, Selector
from worker.library.store import TaskLibrary

__all__ = [
    "DEFAULT_LIBRARY",
    "CachedEmbeddings",
    "Call",
    "Candidate",
    "DemoError",
    "Demonstration",
    "Selection",
    "Selector",
    "TaskLibrary",
    "candidate_from_run",
    "check",
    "load_file",
    "parse",
]
