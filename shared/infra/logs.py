"""Process-wide logging set-up, called once by each entry point (never at import).

Every record, from our ``logging.getLogger(__name__)`` loggers and from libraries alike, goes
through structlog's processors: one JSON object per line (``SAFEDELIVR_LOG_FORMAT=json``, the
default) or a readable line (``console``, what ``make run`` uses). Context bound with
:func:`bound` (a batch, its chunk line, attempt and provider while a message is handled) is
added to every record logged inside it, whichever module logs it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal, TextIO

import orjson
import structlog
from structlog.contextvars import bound_contextvars, merge_contextvars
from structlog.typing import EventDict, Processor, WrappedLogger

LogFormat = Literal["json", "console"]


def configure_logging(
    level: str = "INFO",
    *,
    service: str = "safedelivr",
    fmt: LogFormat = "json",
    stream: TextIO | None = None,
) -> None:
    """Route every record to ``stream`` (stderr) as JSON lines or console lines, tagged with
    the service and whatever context is bound."""

    def add_service(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
        event.setdefault("service", service)
        return event

    chain: list[Processor] = [
        merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        add_service,
        structlog.stdlib.PositionalArgumentsFormatter(),
        structlog.processors.format_exc_info,
    ]
    renderer: Processor = (
        structlog.processors.JSONRenderer(serializer=_json)
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=chain,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    structlog.configure(
        processors=[*chain, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The Cassandra driver and aio-pika are chatty at INFO about reconnects we already report;
    # httpx logs every request at INFO (every provider call, every client command).
    for noisy in ("cassandra", "aio_pika", "aiormq", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    logging.getLogger("cassandra.protocol").addFilter(_drop_use_keyspace_warning)


@contextmanager
def bound(**context: Any) -> Iterator[None]:
    """Add ``context`` to every record logged inside the block (this task only)."""
    with bound_contextvars(**{k: _plain(v) for k, v in context.items() if v is not None}):
        yield


def _plain(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool) else str(value)


def _json(event: Any, **_: Any) -> str:
    return orjson.dumps(event, default=str).decode()


def _drop_use_keyspace_warning(record: logging.LogRecord) -> bool:
    # Cassandra 5 warns on every prepare from a session bound to a keyspace. Binding the
    # session is deliberate (the keyspace is configuration, not part of each statement).
    return "`USE <keyspace>` with prepared statements" not in record.getMessage()
