"""Structured logs: one event name per line, context (run id, user) bound once."""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO, cast

import structlog

# Never log these: they are credentials.
_SECRET_KEYS = ("token", "secret", "api_key", "authorization", "password")


def _redact(
    _logger: object, _name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    for key in list(event):
        if any(part in key.lower() for part in _SECRET_KEYS):
            event[key] = "[redacted]"
    return event


class _Stderr:
    """Whatever sys.stderr is when a line is written (test runners and daemons swap it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure(fmt: str = "console", level: int = logging.INFO) -> None:
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=cast(TextIO, _Stderr())),
        # Not cached: a later configure (the CLI's --verbose, a quiet eval) must reach loggers
        # already used; building one per call costs microseconds, at a few lines per run.
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s %(message)s")
    logging.getLogger().setLevel(max(logging.WARNING, level))


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
