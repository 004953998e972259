"""The use-case layer: everything a surface (Slack, the terminal console, the CLI, eval)
may ask of Switchboard, one module per use case, and `Access`, which answers every "may
this person X" once.

- `asking`: a question becomes a run (`submit`), continuing the asker's conversation.
- `decisions`: approve or reject one request (with edits or instructions), a batch card's
  items, the checks of an Edit submission.
- `runs`: find, inspect, list, cancel, spend, a workspace's runs ending with it.
- `approvals`: one request, those waiting for a person, batch cards, what a card says.
- `library`: save a run as a candidate demonstration.
- `resuming`: a run that waited for a person's connection goes on once they connect.
- `health`: what waits (queue, runs in flight, approvals) and the worker fleet, for status.
- `Access` (worker/access.py, in the runtime so that the loop asks it too): every
  permission check.

Surfaces parse their input, call these and render the result; they never touch the run
store, the approvals store, the event log or the policy themselves (an import-linter
contract in the test suite keeps it so, tests/test_architecture.py). Dependencies point
one way: the surfaces import this layer; it imports the runtime (worker/, approvals/,
tools/); nothing below imports it.
"""

from worker.access import Access
from worker.service.asking import (
    MAX_HISTORY_CHARS,
    QuestionNotStarted,
    QuestionRejected,
    submit,
)
from worker.service.decisions import DecisionOutcome, DecisionResult, decide
from worker.service.runs import CancelResult, cancel

__all__ = [
    "MAX_HISTORY_CHARS",
    "Access",
    "CancelResult",
    "DecisionOutcome",
    "DecisionResult",
    "QuestionNotStarted",
    "QuestionRejected",
    "cancel",
    "decide",
    "submit",
]
