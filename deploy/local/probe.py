#!/usr/bin/env python3
# Owned by deploy/local/ (rabbitmq.sh, cassandra.sh, services.sh call it).
"""Readiness probes for the local Safedelivr services.

Speaks the real protocol instead of checking that a TCP port is open:

* ``amqp``: opens an AMQP 0-9-1 connection with :func:`aio_pika.connect`
  (full handshake: protocol header, ``Connection.Start``/``Tune``/``Open``)
  and closes it again.
* ``cql``: connects with the DataStax Python driver
  (:class:`cassandra.cluster.Cluster`) and runs
  ``SELECT release_version FROM system.local``; prints the version.

Usage::

    probe.py amqp [--url amqp://guest:guest@127.0.0.1:5672/] [--timeout S] [--wait S]
    probe.py cql  [--host 127.0.0.1] [--port 9042] [--protocol-version N]
                  [--timeout S] [--wait S]

``--timeout`` bounds a single attempt; ``--wait`` keeps retrying until the
probe succeeds or that many seconds have passed (default: one attempt).

Exit status: 0 when the service answered, 1 when it did not, 2 on a usage
error or when the client library for the probe is not installed (so callers
can tell "service down" from "probe cannot run").

The client libraries are imported lazily, so the ``amqp`` probe does not need
cassandra-driver and vice versa. Importing this module has no side effects.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Final
from urllib.parse import urlsplit, urlunsplit

EXIT_OK: Final = 0
EXIT_UNAVAILABLE: Final = 1
EXIT_UNUSABLE: Final = 2

DEFAULT_AMQP_URL: Final = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_CQL_HOST: Final = "127.0.0.1"
DEFAULT_CQL_PORT: Final = 9042
RETRY_INTERVAL_S: Final = 0.5

# Loggers of the client libraries that report every failed connection attempt
# (and a few harmless warnings) on stderr; a probe only reports the outcome.
_NOISY_LOGGERS: Final = ("aio_pika", "aiormq", "pamqp", "cassandra")


class ProbeUnusableError(Exception):
    """The probe itself cannot run (e.g. its client library is missing)."""


def _quiet_client_libraries() -> None:
    """Silence the drivers' log records and Python warnings."""
    warnings.simplefilter("ignore")
    for name in _NOISY_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(logging.CRITICAL + 1)
        logger.propagate = False
        logger.addHandler(logging.NullHandler())


def _redact(url: str) -> str:
    """Return *url* with the password (if any) replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = f"{user}:***@{host}"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _describe(exc: BaseException) -> str:
    """One-line description of a connection failure."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


def probe_amqp(url: str, timeout: float) -> str:
    """Open and close one AMQP connection to *url*; return a success message.

    Raises:
        ProbeUnusableError: aio-pika is not installed.
        Exception: anything the connection attempt raised (service down,
            handshake refused, timeout, ...).
    """
    try:
        import aio_pika
    except ImportError as exc:
        raise ProbeUnusableError(f"aio-pika is not installed for {sys.executable} ({exc})") from exc

    async def _attempt() -> None:
        connection = await asyncio.wait_for(aio_pika.connect(url, timeout=timeout), timeout=timeout)
        await asyncio.wait_for(connection.close(), timeout=timeout)

    asyncio.run(_attempt())
    return f"AMQP handshake OK at {_redact(url)}"


def probe_cql(host: str, port: int, timeout: float, protocol_version: int | None) -> str:
    """Query ``system.local`` on a CQL node; return its ``release_version``.

    Raises:
        ProbeUnusableError: cassandra-driver is not installed.
        Exception: anything connecting or querying raised.
    """
    try:
        from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
        from cassandra.policies import WhiteListRoundRobinPolicy
    except ImportError as exc:
        raise ProbeUnusableError(
            f"cassandra-driver is not installed for {sys.executable} ({exc})"
        ) from exc

    profile = ExecutionProfile(
        load_balancing_policy=WhiteListRoundRobinPolicy([host]),
        request_timeout=timeout,
    )
    options: dict[str, int] = {}
    if protocol_version is not None:
        options["protocol_version"] = protocol_version
    cluster = Cluster(
        contact_points=[host],
        port=port,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        connect_timeout=timeout,
        control_connection_timeout=timeout,
        # A probe needs exactly one connection and no topology refreshes.
        schema_metadata_enabled=False,
        token_metadata_enabled=False,
        **options,
    )
    try:
        session = cluster.connect()
        row = session.execute("SELECT release_version FROM system.local").one()
        if row is None:
            raise RuntimeError("system.local returned no row")
        version = str(row.release_version)
        negotiated = cluster.protocol_version
    finally:
        cluster.shutdown()
    print(version)
    return f"CQL OK at {host}:{port}: Cassandra {version} (native protocol v{negotiated})"


def _run_with_retries(attempt: Callable[[], str], wait: float, label: str) -> int:
    """Call *attempt* until it succeeds or *wait* seconds have passed."""
    deadline = time.monotonic() + max(wait, 0.0)
    attempts = 0
    while True:
        attempts += 1
        try:
            message = attempt()
        except ProbeUnusableError as exc:
            print(f"probe: {exc}", file=sys.stderr)
            return EXIT_UNUSABLE
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready"
            if time.monotonic() + RETRY_INTERVAL_S >= deadline:
                tries = f" after {attempts} attempts" if attempts > 1 else ""
                print(f"probe: {label} not available{tries}: {_describe(exc)}", file=sys.stderr)
                return EXIT_UNAVAILABLE
            time.sleep(RETRY_INTERVAL_S)
        else:
            print(f"probe: {message}", file=sys.stderr)
            return EXIT_OK


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="probe.py",
        description="Check that a local service really speaks its protocol.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--timeout",
        type=_positive_float,
        default=5.0,
        help="seconds allowed for one attempt (default: %(default)s)",
    )
    common.add_argument(
        "--wait",
        type=float,
        default=0.0,
        help="keep retrying for up to this many seconds (default: one attempt)",
    )
    sub = parser.add_subparsers(dest="kind", required=True)

    amqp = sub.add_parser("amqp", parents=[common], help="AMQP 0-9-1 handshake (RabbitMQ)")
    amqp.add_argument("--url", default=DEFAULT_AMQP_URL, help="default: %(default)s")

    cql = sub.add_parser("cql", parents=[common], help="CQL query (Cassandra)")
    cql.add_argument("--host", default=DEFAULT_CQL_HOST, help="default: %(default)s")
    cql.add_argument("--port", type=int, default=DEFAULT_CQL_PORT, help="default: %(default)s")
    cql.add_argument(
        "--protocol-version",
        type=int,
        default=None,
        help="force a native protocol version (default: negotiate; v5 on Cassandra 5.0)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    args = _build_parser().parse_args(argv)
    _quiet_client_libraries()
    if args.kind == "amqp":
        url: str = args.url
        return _run_with_retries(
            lambda: probe_amqp(url, args.timeout), args.wait, f"AMQP at {_redact(url)}"
        )
    host: str = args.host
    port: int = args.port
    return _run_with_retries(
        lambda: probe_cql(host, port, args.timeout, args.protocol_version),
        args.wait,
        f"CQL at {host}:{port}",
    )


if __name__ == "__main__":
    # This script's directory holds a "cassandra/" folder (the Maven/config
    # files), which Python would otherwise treat as a namespace package that
    # can shadow the driver's "cassandra" package.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
    sys.exit(main())
