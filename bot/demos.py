"""Saving a completed run as a candidate demonstration (issue 4), for admins, from the run
modal. A candidate is never shown to the model until an admin accepts it with
`switchboard demos review`; this module only adds candidates."""

from __future__ import annotations

import structlog

from bot import messages as m
from bot.mrkdwn import escape
from worker.events import EventKind
from worker.library import DemoError, TaskLibrary, candidate_from_run
from worker.run import Run
from worker.runtime import Runtime

log = structlog.get_logger(__name__)


def library_of(rt: Runtime) -> TaskLibrary:
    """The runtime's task library; a Redis-backed one when demonstrations are off."""
    if rt.demos is not None:
        return rt.demos.library
    return TaskLibrary(rt.redis, namespace=rt.settings.namespace)


def offer(rt: Runtime, run: Run) -> tuple[bool, str]:
    """For an admin looking at `run`: (show the save button, a note instead of it)."""
    try:
        demo = candidate_from_run(run)
        saved = library_of(rt).get(demo.id)
    except DemoError:  # not completed, no successful call, or a library that does not load
        return False, ""
    if saved is not None:
        return False, already(saved.id, saved.status)
    return True, ""


def save(rt: Runtime, run: Run, by: str) -> str:
    """Add `run` as a candidate; returns what to tell the admin. The caller checked `by` is
    an admin."""
    try:
        demo = candidate_from_run(run)
        library = library_of(rt)
        saved = library.get(demo.id)
        if saved is not None:
            return already(saved.id, saved.status)
        library.add_candidate(demo)
    except DemoError as exc:
        log.info("demo_not_saved", run_id=run.id, user=by, error=str(exc)[:300])
        return m.DEMO_NOT_SAVED.format(reason=escape(str(exc)))
    rt.events.append(run.id, EventKind.DEMO_CANDIDATE_SAVED, demo=demo.id, by=by)
    log.info("demo_candidate_saved", run_id=run.id, demo_id=demo.id, user=by)
    return m.DEMO_SAVED.format(demo_id=escape(demo.id))


def already(demo_id: str, status: str) -> str:
    return m.DEMO_ALREADY.format(
        demo_id=escape(demo_id), status=m.DEMO_STATUS.get(status, escape(status))
    )
