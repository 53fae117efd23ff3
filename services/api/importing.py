"""Running a contact list's CSV import in the API process, in the background: the shell
around :mod:`services.api.list_import`'s decisions.

The file is read a slice of rows at a time, as a stream (on the API's CPU lane: parsing
never holds the event loop, and only the slice at hand is in memory, whatever the file's
size); each slice's addresses are looked up (suppressed for the user, unsubscribed from
this list, already in the list), decided, written, and the import's progress saved with a
new heartbeat, so a reader sees it advance and a dead process shows as a stale import.
When the file ends the list's count is recounted.

A list's unsubscribes are its ``list_suppressions`` under the scope of the list's id (as a
string): mail sent to the list names it with ``list`` = its id, so its one-click
unsubscribes land there.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from services.api.contact_lists import ContactBook, list_scope
from services.api.contacts_csv import Contact, CsvError, Rejected, Source, scan
from services.api.list_import import ImportJob, Sorted, advance, finish, sort_slice
from shared.audience.suppressions import Suppressions
from shared.core.addresses import address_key
from shared.core.errors import DependencyUnavailable
from shared.infra.config import ListSettings
from shared.infra.gil import CpuLane

log = logging.getLogger(__name__)

#: Why an import failed when a store failed under it (details are logged).
STORE_FAILED = "failed: the database was unavailable; import the file again"
#: Why an import failed on an error nobody expected (logged with its traceback).
UNEXPECTED = "failed: an unexpected error stopped the import (it has been logged)"


@dataclass(frozen=True, slots=True)
class Importer:
    lists: ContactBook
    suppressions: Suppressions
    settings: ListSettings
    cpu: CpuLane

    async def run(self, job: ImportJob, source: Source, *, base: int) -> ImportJob:
        """Import ``source`` (the file, or its bytes) into ``job``'s list, which held
        ``base`` contacts; the job as it ended (also saved). Never raises for a bad file, an
        outage or any other error: the job fails with the reason."""
        job = replace(job, state="running", heartbeat=_now())
        try:
            await self.lists.save_import(job)
            rows = scan(source, max_rows=self.settings.import_max_rows)
            while True:
                part, broken = await self.cpu.run(_next, rows, self.settings.import_slice)
                if part:
                    room = self.settings.max_contacts - base - job.progress.added
                    done = await self._sort(job, part, room)
                    await self.lists.put(job.list_id, done.write)
                    job = advance(job, done, _now())
                    await self.lists.save_import(job)
                    await self.lists.set_count(job.user_id, job.list_id, base + job.progress.added)
                if broken is not None:
                    raise broken
                if not part:
                    break
            counted = await self.lists.count(job.list_id)
            await self.lists.set_count(job.user_id, job.list_id, counted)
            job = finish(job, _now())
        except CsvError as exc:
            job = finish(job, _now(), str(exc))
        except DependencyUnavailable as exc:
            log.warning("import %s of list %s failed: %s", job.import_id, job.list_id, exc)
            job = finish(job, _now(), STORE_FAILED)
        except Exception:
            # Anything else (a request the database refuses, a bug) would leave the job
            # running until it read as interrupted, and the list uncounted: end it now.
            log.exception("import %s of list %s failed", job.import_id, job.list_id)
            job = finish(job, _now(), UNEXPECTED)
        await self.lists.save_import(job)
        return job

    async def _sort(self, job: ImportJob, part: list[Contact | Rejected], room: int) -> Sorted:
        keys = [address_key(c.email) for c in part if isinstance(c, Contact)]
        suppressed = await self.suppressions.suppressed(job.user_id, keys)
        rest = [k for k in keys if k not in suppressed]
        # The scoped lookup answers the user-wide ones too: none are left in ``rest``.
        unsubscribed = (
            await self.suppressions.suppressed(job.user_id, rest, list_scope(job.list_id))
            if rest
            else {}
        )
        candidates = [k for k in rest if k not in unsubscribed]
        existing = await self.lists.existing(job.list_id, candidates) if candidates else set()
        return sort_slice(
            part, suppressed=suppressed, unsubscribed=unsubscribed, existing=existing, room=room
        )


def _next(
    rows: Iterator[Contact | Rejected], size: int
) -> tuple[list[Contact | Rejected], CsvError | None]:
    """The next slice of rows, and the error that ended the file within it, if one did (the
    rows before a bad one are imported, as the slices before it were)."""
    out: list[Contact | Rejected] = []
    try:
        for row in itertools.islice(rows, size):
            out.append(row)
    except CsvError as exc:
        return out, exc
    return out, None


def _now() -> datetime:
    return datetime.now(UTC)
