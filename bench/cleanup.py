"""``python -m bench.cleanup``: remove what interrupted benchmark runs left behind.

A run drops its keyspace and deletes its topology at the end, but a Cassandra or RabbitMQ
restart in the middle (or a kill -9) can leave them. Their names carry the run's UTC start
time (``bench_<yyyymmddThhmmssz>_<tag>``, exchange ``bench-...``); this drops those older
than ``--older-than`` minutes (default 60, so a run in progress elsewhere is left alone).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from shared.infra.broker import Broker
from shared.infra.config import load_settings
from shared.infra.db import Database
from shared.infra.resources import topology_for

_NAME = re.compile(r"^bench_(\d{8}t\d{6}z)_[0-9a-f]{6}$")


def stale(names: Sequence[str], now: datetime, older_than: timedelta) -> list[str]:
    """The benchmark keyspaces among ``names`` started more than ``older_than`` before ``now``."""
    out = []
    for name in names:
        match = _NAME.match(name)
        if match is None:
            continue
        started = datetime.strptime(match.group(1), "%Y%m%dt%H%M%Sz").replace(tzinfo=UTC)
        if now - started > older_than:
            out.append(name)
    return sorted(out)


async def clean(older_than: timedelta) -> int:
    base = load_settings()
    db = await Database.connect(base.cassandra)
    try:
        rows = await db.rows("SELECT keyspace_name FROM system_schema.keyspaces")
        names = stale([r["keyspace_name"] for r in rows], datetime.now(UTC), older_than)
        for keyspace in names:
            exchange = keyspace.replace("_", "-")
            settings = base.model_copy(
                update={"amqp": base.amqp.model_copy(update={"exchange": exchange})}
            )
            broker = Broker(base.amqp.url.get_secret_value(), topology_for(settings))
            await broker.connect()
            try:
                await broker.delete()
            finally:
                await broker.close()
            await db.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", prepare=False, timeout=120)
            print(f"dropped keyspace {keyspace} and deleted exchange {exchange}")
    finally:
        await db.close()
    if not names:
        print("nothing to clean up")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cleanup", description=__doc__)
    parser.add_argument("--older-than", type=float, default=60.0, help="minutes (default 60)")
    args = parser.parse_args(argv)
    return asyncio.run(clean(timedelta(minutes=args.older_than)))


if __name__ == "__main__":
    sys.exit(main())
