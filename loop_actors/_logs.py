"""The runtime's logs: one logger per package, typed fields, loops' errors rate-limited, JSON.

Every module logs through the logger of its package (:func:`package_logger`):
``loop_actors.runtime``, ``loop_actors.store``, ``loop_actors.workers``... The
``loop_actors`` logger has a ``NullHandler`` and the library configures nothing else,
so it prints nothing unless the application (or the CLI) configures logging.

A record's facts travel as fields (``extra=``, built by :func:`fields`): an
invocation's id, step, tool, outcome, reason, the loop that caught an error. Never a
raw idempotency key (:func:`effect_key_hash` names one), an argument, a result or a
secret. When an OpenTelemetry span is current (the application configured tracing),
its ``trace_id`` and ``span_id`` are added.

An error a background loop catches goes through a :class:`Throttle`: logged the first
time, then at most once every :data:`LOG_EVERY_S` for the same loop and error class;
the next record logged says how many were not (its ``suppressed`` field).

Standard library only: the CLI's options import it before trio.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from enum import Enum, StrEnum
from typing import Any

ROOT_LOGGER = "loop_actors"

logging.getLogger(ROOT_LOGGER).addHandler(logging.NullHandler())

LOG_EVERY_S = 60.0
"""A loop's error of one class is logged at most this often (the rest are counted)."""


class BackgroundLoop(StrEnum):
    """The background loops (and the Journal's thread) whose caught errors are logged."""

    HEARTBEAT = "heartbeat"
    """Renewing the held leases (``LeaseKeeper.run_heartbeat``)."""
    LEASE_RELEASE = "lease_release"
    """Giving leases back after a run, or at close."""
    CANCEL_WATCHER = "cancel_watcher"
    """Looking for cancel requests made by other processes."""
    CLAIMS = "claims"
    """A worker claiming runnable invocations."""
    CLAIM_READS = "claim_reads"
    """A worker reading what its claimed runs need, for a batch at once."""
    DRIVES = "drives"
    """A worker driving the runs it claimed."""
    SCHEDULES = "schedules"
    """A worker checking the schedules and submitting their due runs."""
    JOURNAL = "journal"
    """The Journal writing a group of commits."""
    AFTER_COMMIT = "after_commit"
    """The Journal's after-commit hook (the checkpointer's count of commits)."""
    READ_MODELS = "read_models"
    """The follower keeping the read models caught up."""
    CHECKPOINTS = "checkpoints"
    """The checkpointer writing checkpoints of the log outside the store."""
    STORE = "store"
    """A store failure met by any task (``StoreOutages``: one warning per outage)."""


def package_logger(module: str) -> logging.Logger:
    """The logger of the package ``module`` belongs to (``loop_actors.runtime`` for its modules).

    A module of ``loop_actors`` itself (``loop_actors._logs``) logs as ``loop_actors``.
    """
    parts = module.split(".")
    if len(parts) > 2 and parts[0] == ROOT_LOGGER:
        return logging.getLogger(".".join(parts[:2]))
    if len(parts) == 2 and parts[0] == ROOT_LOGGER and parts[1].startswith("_"):
        return logging.getLogger(ROOT_LOGGER)
    return logging.getLogger(module)


def effect_key_hash(key: str) -> str:
    """How a log line names an effect key: the first 16 hex digits of its SHA-256, never the key."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _trace_fields() -> dict[str, str]:
    """``trace_id`` and ``span_id`` of the current OpenTelemetry span, if tracing is on.

    Only when the application imported OpenTelemetry (its tracing configured): this
    never imports it, and a span that is not recording (no SDK) adds nothing.
    """
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return {}
    try:
        context = trace.get_current_span().get_span_context()
    except Exception:  # a broken tracer never stops a log line: the ids are left out
        return {}
    if not getattr(context, "is_valid", False):
        return {}
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


def fields(
    *,
    invocation_id: str | None = None,
    step: int | None = None,
    tool: str | None = None,
    outcome: str | None = None,
    reason: str | None = None,
    agent: str | None = None,
    holder: str | None = None,
    epoch: int | None = None,
    loop: BackgroundLoop | None = None,
    error_type: str | None = None,
    effect_key: str | None = None,
    effect_status: str | None = None,
    suppressed: int | None = None,
) -> dict[str, Any]:
    """The ``extra=`` of a record: the fields given (enums as their values), trace ids.

    ``effect_key`` is logged as ``effect_key_hash`` (:func:`effect_key_hash`), never raw.
    """
    given: dict[str, Any] = {
        "invocation_id": invocation_id,
        "step": step,
        "tool": tool,
        "outcome": outcome,
        "reason": reason,
        "agent": agent,
        "holder": holder,
        "epoch": epoch,
        "loop": loop,
        "error_type": error_type,
        "effect_key_hash": None if effect_key is None else effect_key_hash(effect_key),
        "effect_status": effect_status,
        "suppressed": suppressed,
    }
    found = {
        name: value.value if isinstance(value, Enum) else value
        for name, value in given.items()
        if value is not None
    }
    found.update(_trace_fields())
    return found


FIELDS = (
    "invocation_id",
    "step",
    "tool",
    "outcome",
    "reason",
    "agent",
    "holder",
    "epoch",
    "loop",
    "error_type",
    "effect_key_hash",
    "effect_status",
    "suppressed",
    "trace_id",
    "span_id",
)
"""Every field :func:`fields` may add, in the order the formatters show them."""


class Throttle:
    """Logs an error a loop caught at most once every ``every_s`` per (logger, loop, error class).

    The first occurrence is logged at once, with its traceback; repeats within
    ``every_s`` are counted, and the next one logged after that says how many were
    not (``suppressed``). Each is noted as :attr:`last_error`, logged or not.
    Thread-safe (the Journal's thread uses one). One per runtime (and Journal), so
    that two runtimes of one process do not silence each other.
    """

    def __init__(
        self, *, every_s: float = LOG_EVERY_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """Nothing caught yet."""
        self.every_s = every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, BackgroundLoop, str], tuple[float, int]] = {}
        """Per (logger, loop, error class): when it was last logged, how many since were not."""
        self.last_error: tuple[str, BackgroundLoop, datetime] | None = None
        """The class of the last error caught, the loop that caught it, and when (UTC)."""

    def caught(
        self,
        logger: logging.Logger,
        loop: BackgroundLoop,
        error: BaseException,
        message: str,
        *args: object,
        level: int = logging.WARNING,
        exc_info: bool = True,
        invocation_id: str | None = None,
    ) -> bool:
        """Log that ``loop`` caught ``error`` (``message % args``), unless it did just now.

        Returns whether a record was logged (False: it was counted).
        """
        key = (logger.name, loop, type(error).__name__)
        now = self._clock()
        with self._lock:
            self.last_error = (key[2], loop, datetime.now(UTC))
            last = self._seen.get(key)
            if last is not None and now - last[0] < self.every_s:
                self._seen[key] = (last[0], last[1] + 1)
                return False
            suppressed = 0 if last is None else last[1]
            self._seen[key] = (now, 0)
        if suppressed:
            message += " (%d more like it not logged in the last %.0f s)"
            args = (*args, suppressed, now - last[0] if last is not None else 0.0)
        logger.log(
            level,
            message,
            *args,
            exc_info=error if exc_info else None,
            extra=fields(
                loop=loop,
                error_type=type(error).__name__,
                invocation_id=invocation_id,
                suppressed=suppressed or None,
            ),
        )
        return True


_RECORD_ATTRIBUTES = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a record carries beyond the standard ones (``extra=``), ours first."""
    extra = {
        name: value
        for name, value in record.__dict__.items()
        if name not in _RECORD_ATTRIBUTES and not name.startswith("_")
    }
    ordered = {name: extra.pop(name) for name in FIELDS if name in extra}
    ordered.update(sorted(extra.items()))
    return ordered


def _json_value(value: object) -> object:
    if isinstance(value, Enum):
        return value.value
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


class JsonLogFormatter(logging.Formatter):
    """One JSON object per record, on one line: time, level, logger, message, its fields.

    ``time`` is ISO 8601 in UTC with microseconds; ``level`` lower-case; the record's
    fields (``extra=``) follow by name; a traceback is ``exception`` (its text).
    """

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="microseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in record_fields(record).items():
            line.setdefault(name, _json_value(value))
        if record.exc_info:
            line["exception"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        elif record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, ensure_ascii=False)


class TextLogFormatter(logging.Formatter):
    """The message first, then ``[level logger key=value ...]``; a traceback below it."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a line of text (and its traceback's lines)."""
        shown = " ".join(f"{name}={value}" for name, value in record_fields(record).items())
        tail = f"{record.levelname.lower()} {record.name}" + (f" {shown}" if shown else "")
        text = f"{record.getMessage()} [{tail}]"
        if record.exc_info:
            text += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return text


class LogFormat(StrEnum):
    """The CLI's ``--log-format``."""

    TEXT = "text"
    JSON = "json"


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
"""The CLI's ``--log-level`` values."""

CLI_LOGGERS = (ROOT_LOGGER, "projections")
"""The loggers the CLI writes to stderr (an agent module's own logging is its own)."""


@contextlib.contextmanager
def logging_to_stderr(log_format: LogFormat, level: str) -> Iterator[logging.Handler]:
    """Write the records of :data:`CLI_LOGGERS` of ``level`` and above to stderr, formatted.

    On exit the handler is taken off and the loggers' levels put back (the CLI also
    runs in-process, in tests and scripts).
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter() if log_format is LogFormat.JSON else TextLogFormatter())
    loggers = [logging.getLogger(name) for name in CLI_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(level.upper())
    try:
        yield handler
    finally:
        for logger, before in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(before)


__all__ = [
    "CLI_LOGGERS",
    "FIELDS",
    "LOG_EVERY_S",
    "LOG_LEVELS",
    "ROOT_LOGGER",
    "BackgroundLoop",
    "JsonLogFormatter",
    "LogFormat",
    "TextLogFormatter",
    "Throttle",
    "effect_key_hash",
    "fields",
    "logging_to_stderr",
    "package_logger",
    "record_fields",
]
