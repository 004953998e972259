"""The task library from a surface: save a completed run as a candidate demonstration (an
admin's act, from the run view or the CLI), whether a run could be saved, and what a
question would be shown."""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from worker.events import EventKind
from worker.library import DemoError, Demonstration, Selection, TaskLibrary, candidate_from_run
from worker.run import Run
from worker.runtime import Runtime

log = structlog.get_logger(__name__)


def library_of(rt: Runtime) -> TaskLibrary:
    """The runtime's task library; a Redis-backed one when demonstrations are off."""
    if rt.demos is not None:
        return rt.demos.library
    return TaskLibrary(rt.redis, namespace=rt.settings.namespace)


@dataclass(frozen=True)
class Saved:
    demo_id: str
    status: str  # "candidate" when saved now; else the status of the one saved before
    new: bool  # saved now, not before
    error: str = ""  # why it could not be saved (then demo_id is "")


def offer(rt: Runtime, run: Run) -> tuple[bool, Saved | None]:
    """For an admin looking at `run`: may it be saved now, and the demonstration saved from
    it before, if any. (False, None): it cannot be saved (not completed, no successful
    call, or a library that does not load)."""
    try:
        found = library_of(rt).get(candidate_from_run(run).id)
    except DemoError:
        return False, None
    if found is not None:
        return False, Saved(found.id, found.status, new=False)
    return True, None


def save(rt: Runtime, run: Run, by: str) -> Saved:
    """Add `run` as a candidate; an admin accepts it later (`switchboard demos review`).
    The caller checked `Access.may_administer`."""
    try:
        demo: Demonstration = candidate_from_run(run)
        library = library_of(rt)
        found = library.get(demo.id)
        if found is not None:
            return Saved(found.id, found.status, new=False)
        library.add_candidate(demo)
    except DemoError as exc:
        log.info("demo_not_saved", run_id=run.id, user=by, error=str(exc)[:300])
        return Saved("", "", new=False, error=str(exc))
    rt.events.append(run.id, EventKind.DEMO_CANDIDATE_SAVED, demo=demo.id, by=by)
    log.info("demo_candidate_saved", run_id=run.id, demo_id=demo.id, user=by)
    return Saved(demo.id, demo.status, new=True)


def preview(rt: Runtime, question: str) -> Selection | None:
    """The demonstrations `question` would be shown by the default task library, as if its
    asker may call every tool, and why the others would be left out; nothing is recorded.
    None: demonstrations are off."""
    if rt.demos is None:
        return None
    return rt.demos.choose(question, set(rt.registry.names()), record=False)
