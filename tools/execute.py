"""Running a tool: in a thread, with a timeout, an output cap, and no escaping errors."""

from __future__ import annotations

import contextvars
import dataclasses
import enum
import json
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass, replace
from typing import Any

import structlog
from pydantic import BaseModel

from tools.context import ToolContext
from tools.exceptions import NeedsMoreAccess, NotConnected, ToolError, bounded
from tools.registry import Tool
from tools.threads import InThread

log = structlog.get_logger(__name__)

MAX_ERROR_CHARS = 1000
MAX_TRACE_CHARS = 20_000  # the frames of a failed tool call, in its log line


@dataclass(frozen=True)
class Observation:
    """What a tool call produced, as the model will read it.

    `text` is already capped and says when it was truncated.
    """

    ok: bool
    text: str
    truncated: bool = False
    needs_connection: str = ""  # the provider the person must connect (NotConnected)
    more_access: tuple[str, ...] = ()  # ... again, asking for these too (NeedsMoreAccess)


def execute(
    tool: Tool,
    ctx: ToolContext,
    args: dict[str, Any],
    *,
    executor: ThreadPoolExecutor | None = None,
) -> Observation:
    """Run `tool.handler(ctx, args)` with the tool's timeout and output cap.

    The timeout is the tool's, cut to the run's deadline when the context has one. Without
    an executor the handler runs in its own daemon thread, so a handler that never returns
    cannot keep the process from exiting.
    """
    started = time.monotonic()
    timeout = ctx.time_left(tool.timeout)
    outcome = _run(tool, ctx, args, executor, timeout)
    elapsed_ms = round((time.monotonic() - started) * 1000)
    if isinstance(outcome, _TimedOut):
        log.warning("tool_timed_out", tool=tool.name, timeout=timeout, call_id=ctx.call_id)
        return _error(tool, timed_out(tool, timeout))
    if isinstance(outcome, _Failed) and isinstance(outcome.error, NotConnected):
        log.info("tool_not_connected", tool=tool.name, call_id=ctx.call_id)
        return replace(
            _error(tool, outcome.error.message),
            needs_connection=outcome.error.provider,
            more_access=outcome.error.scopes if isinstance(outcome.error, NeedsMoreAccess) else (),
        )
    if isinstance(outcome, _Failed) and isinstance(outcome.error, ToolError):
        log.info("tool_error", tool=tool.name, call_id=ctx.call_id, error=outcome.error.message)
        return _error(tool, outcome.error.message)
    if isinstance(outcome, _Failed):
        error = outcome.error
        message = bounded(f"Error: {type(error).__name__}: {error}", MAX_ERROR_CHARS)
        # the frames and the bounded message, not exc_info: a tool's exception text is
        # unbounded (a 1 MB message took minutes to render in a log line)
        log.warning(
            "tool_failed",
            tool=tool.name,
            call_id=ctx.call_id,
            error_type=type(error).__name__,
            error=message,
            traceback=bounded(
                "Traceback (most recent call last):\n"
                + "".join(traceback.format_tb(error.__traceback__)),
                MAX_TRACE_CHARS,
            ),
        )
        return _error(tool, message)
    observation = observe(outcome.result, tool.output_cap)
    log.info(
        "tool_executed",
        tool=tool.name,
        call_id=ctx.call_id,
        elapsed_ms=elapsed_ms,
        chars=len(observation.text),
        truncated=observation.truncated,
    )
    return observation


def timed_out(tool: Tool, timeout: float) -> str:
    """What the model reads when a call ran out of time. A write may have had its effect
    before it was abandoned, so it is reported as unknown, never as not done."""
    text = f"Error: {tool.name} timed out after {timeout:g} s"
    if tool.effect == "write":
        text += "; its outcome is unknown (it may have taken effect) and it was not retried"
    return text


def observe(result: Any, output_cap: int) -> Observation:
    """Turn a handler's return value into an ok observation of at most `output_cap` chars."""
    text = result if isinstance(result, str) else to_json_text(result)
    text, truncated = cap_text(valid_unicode(text), output_cap)
    return Observation(ok=True, text=text, truncated=truncated)


def to_json_text(value: Any) -> str:
    """Compact JSON for any return value; odd types fall back to `str`."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_jsonable)
    except (TypeError, ValueError, RecursionError):  # circular or too deep
        return str(value)


def cap_text(text: str, cap: int) -> tuple[str, bool]:
    """Cut `text` to `cap` characters, ending with a line that says what was cut."""
    if len(text) <= cap:
        return text, False
    shown = cap
    for _ in range(3):  # the note's own length depends on `shown`; settles in two rounds
        note = f"\n[truncated: showed {shown} of {len(text)} characters]"
        shown = max(cap - len(note), 0)
    note = f"\n[truncated: showed {shown} of {len(text)} characters]"
    return text[:shown] + note, True


def _error(tool: Tool, message: str) -> Observation:
    text, truncated = cap_text(valid_unicode(message), tool.output_cap)
    return Observation(ok=False, text=text, truncated=truncated)


class _TimedOut:
    pass


@dataclass(frozen=True)
class _Failed:
    error: BaseException


@dataclass(frozen=True)
class _Returned:
    result: Any


_Outcome = _TimedOut | _Failed | _Returned


def _call(tool: Tool, ctx: ToolContext, args: dict[str, Any]) -> _Failed | _Returned:
    try:
        return _Returned(tool.handler(ctx, args))
    except BaseException as error:  # tool boundary: every failure becomes an observation
        return _Failed(error)


def _run(
    tool: Tool,
    ctx: ToolContext,
    args: dict[str, Any],
    executor: ThreadPoolExecutor | None,
    timeout: float,
) -> _Outcome:
    if executor is not None:
        # the handler runs with the caller's context: its log lines name the run (structlog's
        # bound run id), its spans are children of the call's (a new thread starts with none)
        context = contextvars.copy_context()
        future = executor.submit(context.run, _call, tool, ctx, args)
        try:
            return future.result(timeout=timeout)
        except FutureTimeoutError:
            future.cancel()
            return _TimedOut()
    running = InThread(lambda: _call(tool, ctx, args), f"tool-{tool.name}")  # same context
    if not running.done.wait(timeout):
        return _TimedOut()
    return running.result()


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, set | frozenset):
        return sorted(value, key=str)
    return str(value)


def valid_unicode(text: str) -> str:
    """Replace lone surrogates so the text can always be stored and sent as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text
