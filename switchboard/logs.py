"""Structured logs: one event name per line, context (run id, user) bound once."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import MutableMapping
from typing import Any, TextIO, cast

import structlog

from worker.redact import REDACTED, secret_key


def _redact(
    _logger: object, _name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Never log a credential: a field whose name says it is one (worker/redact.py)."""
    for key in list(event):
        if secret_key(key):
            event[key] = REDACTED
    return event


class _Stderr:
    """Whatever sys.stderr is when a line is written (test runners and daemons swap it).

    Our lines (structlog) and the libraries' (the standard library's handler) come from many
    threads at once: each writer hands over a whole line in one `write`, and one lock orders
    the writes, so no line is split by another (structlog's PrintLogger wrote the text and
    its newline apart: RQ's line landed between them, and neither parsed as JSON)."""

    # Reentrant: a signal handler that logs (a second SIGTERM: worker/process.py) may run in
    # the middle of a write of its own thread.
    _lock = threading.RLock()

    def write(self, text: str) -> int:
        with self._lock:
            return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


_STDERR = cast(TextIO, _Stderr())


class _Lines:
    """structlog's logger: each line in one write to `_STDERR`, ordered by its lock alone
    (structlog's own loggers add a lock per file that is not reentrant)."""

    def msg(self, message: str) -> None:
        _STDERR.write(message + "\n")
        _STDERR.flush()

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


_LINES = _Lines()


def configure(fmt: str = "console", level: int = logging.INFO) -> None:
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    stamped: list[structlog.typing.Processor] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _redact,
        structlog.processors.format_exc_info,
    ]
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, *stamped, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=lambda *_args: _LINES,
        # Not cached: a later configure (the CLI's --verbose, a quiet eval) must reach loggers
        # already used; building one per call costs microseconds, at a few lines per run.
        cache_logger_on_first_use=False,
    )
    _configure_stdlib(fmt, renderer, stamped)
    logging.getLogger().setLevel(max(logging.WARNING, level))


class _StdlibHandler(logging.StreamHandler[TextIO]):
    """Where the libraries' own log lines go (RQ, slack_sdk, ...): stderr, like ours."""


def _configure_stdlib(
    fmt: str, renderer: structlog.typing.Processor, stamped: list[structlog.typing.Processor]
) -> None:
    """The libraries log through the standard library. With json, their lines go through the
    same processors and renderer as ours, so every line of a process is one JSON object
    (`event` is the library's message, `logger` its logger's name)."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StdlibHandler)]:
        root.removeHandler(old)  # configured again (--verbose): one handler, the new format
    handler = _StdlibHandler(_STDERR)  # StreamHandler writes a line and its end in one write
    if fmt == "json":
        handler.setFormatter(
            structlog.stdlib.ProcessorFormatter(
                foreign_pre_chain=[structlog.stdlib.add_logger_name, *stamped],
                processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            )
        )
    else:
        handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    root.addHandler(handler)


class _DropReported(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


def drop_reported(prefix: str) -> None:
    """Drop a library's log lines (stdlib logging) that start with `prefix`: a failure the
    command line reports itself, in one line, instead of a multi-line dump."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(_DropReported(prefix))
