"""structlog set-up: console text in development, one JSON object per line in production."""

from __future__ import annotations

import logging
import sys

import structlog

#: The level events must reach; a reload changes it (set_log_level) for loggers
#: already in use too, which a filtering wrapper class, cached on first use, would not.
_min_level = [logging.INFO]


def _level_number(level: str) -> int:
    return getattr(logging, level.upper(), logging.INFO)


def _drop_below_level(logger: object, method: str, event: dict) -> dict:
    if _level_number(method) < _min_level[0]:
        raise structlog.DropEvent
    return event


def set_log_level(level: str) -> None:
    """Apply a new level at once, to every logger (``reload`` with a new ``log_level``)."""
    _min_level[0] = _level_number(level)


class _StreamLogger(structlog.WriteLogger):
    """structlog's one-write-per-event logger that outlives its reader: when the stream is
    gone (a closed pipe, a full disk), the event is dropped and the server goes on serving;
    a SIGTERM's ``shutdown_requested`` must never be what stops the stop."""

    def msg(self, message: str) -> None:
        try:
            super().msg(message)
        except (OSError, ValueError):  # EPIPE, ENOSPC; ValueError: the stream was closed
            pass

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


class _StreamLoggerFactory:
    def __call__(self, *args: object) -> _StreamLogger:
        return _StreamLogger(sys.stderr)


def configure_logging(fmt: str = "console", level: str = "info") -> None:
    _min_level[0] = _level_number(level)
    renderer = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            _drop_below_level,
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        # One write per event (print writes the line and its newline apart): the workers of
        # a box (kestreld/workers/) share one stream, and their lines must not interleave.
        logger_factory=_StreamLoggerFactory(),
        cache_logger_on_first_use=True,
    )
