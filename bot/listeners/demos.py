"""Saving a completed run as a candidate demonstration (issue 4), for admins, from the run
modal: what to offer and what to say (worker.service.library does the saving). A
candidate is never shown to the model until an admin accepts it with
`switchboard demos review`."""

from __future__ import annotations

from bot.render import messages as m
from bot.render.mrkdwn import escape
from worker.run import Run
from worker.runtime import Runtime
from worker.service import library


def offer(rt: Runtime, run: Run) -> tuple[bool, str]:
    """For an admin looking at `run`: (show the save button, a note instead of it)."""
    may_save, saved = library.offer(rt, run)
    return may_save, already(saved) if saved is not None else ""


def save(rt: Runtime, run: Run, by: str) -> str:
    """Add `run` as a candidate; returns what to tell the admin. The caller checked `by` is
    an admin."""
    saved = library.save(rt, run, by)
    if saved.error:
        return m.DEMO_NOT_SAVED.format(reason=escape(saved.error))
    if not saved.new:
        return already(saved)
    return m.DEMO_SAVED.format(demo_id=escape(saved.demo_id))


def already(saved: library.Saved) -> str:
    return m.DEMO_ALREADY.format(
        demo_id=escape(saved.demo_id), status=m.DEMO_STATUS.get(saved.status, escape(saved.status))
    )
