"""Process-wide logging set-up, called once by each entry point (never at import)."""

from __future__ import annotations

import logging
import sys


def configure_logging(level: str = "INFO", *, service: str = "safedelivr") -> None:
    """Log one line per record to stderr, tagged with the service name."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(
            f"%(asctime)s %(levelname)-7s {service} %(name)s: %(message)s",
            datefmt="%Y-%m-%dT%H:%M:%S",
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The Cassandra driver and aio-pika are chatty at INFO about reconnects we already report.
    for noisy in ("cassandra", "aio_pika", "aiormq"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    logging.getLogger("cassandra.protocol").addFilter(_drop_use_keyspace_warning)


def _drop_use_keyspace_warning(record: logging.LogRecord) -> bool:
    # Cassandra 5 warns on every prepare from a session bound to a keyspace. Binding the
    # session is deliberate (the keyspace is configuration, not part of each statement).
    return "`USE <keyspace>` with prepared statements" not in record.getMessage()
