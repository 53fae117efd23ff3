"""Reading a contact list's CSV import (pure): which column holds the address, the other
columns as the contact's fields (its substitutions), and what is reported rather than
imported: invalid addresses (with row and reason), duplicates (the first one wins), and rows
past the limit. Suppressed and unsubscribed contacts are the store's to report: they are
valid rows here.

The first row is the header when one of its cells names the address column (``email``,
``e-mail``, ``email address``, ``address``); otherwise the column whose first cell is an
address is the address column, and the other columns are named by their position from 0:
``field0``, ``field1``... (the address column's number is skipped). A header cell that
names nothing is named the same way.

Only the delimiter is guessed (comma, semicolon or tab: the one found most often outside
quotes in the first row); quoting is always CSV's own (RFC 4180: ``"`` quotes a cell, ``""``
inside one is a quote), so an apostrophe in a cell, or a sample without doubled quotes, never
changes how the rest of the file is read. Rows may end in LF, CRLF or CR alone.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from shared.addresses import AddressError, address_key, normalize_email

#: Header names taken for the address column (compared in lower case, trimmed).
EMAIL_HEADERS: Final = frozenset({"email", "e-mail", "email address", "e-mail address", "address"})
#: Longest field name and value kept.
MAX_FIELD_NAME: Final = 64
MAX_FIELD_VALUE: Final = 1_000
#: Fields kept per contact.
MAX_FIELDS: Final = 50
#: The delimiters a file may use, in the order preferred on a tie.
DELIMITERS: Final = (",", ";", "\t")
#: Characters of the file looked at to find the first row's delimiter.
_FIRST_ROW_SCAN: Final = 64 * 1024


class CsvError(ValueError):
    """A file that cannot be imported at all (no address column, not text, not CSV)."""


@dataclass(frozen=True, slots=True)
class Contact:
    email: str
    fields: dict[str, str]
    row: int = field(default=0, compare=False)
    """Where it was read (as :attr:`Rejected.row`), for reporting what becomes of it."""


@dataclass(frozen=True, slots=True)
class Rejected:
    row: int
    """1-based, as a spreadsheet numbers it (the header is row 1, blank rows count)."""
    value: str
    reason: str
    kind: Literal["invalid", "duplicate", "over_limit"] = "invalid"


def check(data: bytes) -> None:
    """Raise :class:`CsvError` now for a file that cannot be imported at all (not UTF-8,
    empty, no address column), so that a request can be refused before it is queued."""
    next(scan(data, max_rows=1), None)


def scan(data: bytes, *, max_rows: int) -> Iterator[Contact | Rejected]:
    """Every row of a CSV file (UTF-8, with or without BOM; comma, semicolon or tab) as a
    contact or as rejected, one at a time in file order (a large file is never held as
    contacts). Rows past ``max_rows`` come as rejected with the kind ``over_limit``.

    Raises:
        CsvError: when the file cannot be imported at all, or (while iterating) a row is not
            CSV (a NUL byte, an oversized field).
    """
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CsvError(f"the file is not UTF-8 text (byte {exc.start})") from None
    rows = _rows(text)
    first = next(rows, None)
    if first is None:
        raise CsvError("the file is empty")
    number, head = first
    column, names, start = _layout(head)
    seen: set[str] = set()
    taken = 0
    if start == 1:
        yield _take(seen, head, number, column, names)
        taken += 1
    for number, row in rows:
        if taken >= max_rows:
            value = row[column].strip() if column < len(row) else ""
            yield Rejected(number, value[:320], "past the row limit", "over_limit")
            continue
        yield _take(seen, row, number, column, names)
        taken += 1


def _rows(text: str) -> Iterator[tuple[int, list[str]]]:
    """Each non-blank row with its number (blank rows are numbered too, as a spreadsheet
    shows them)."""
    # newline="": the csv module sees line ends as they are (a CR alone ends a row, a line
    # end inside quotes stays in its cell).
    reader = csv.reader(io.StringIO(text, newline=""), csv.excel, delimiter=delimiter(text))
    number = 0
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise CsvError(f"row {number + 1} is not CSV: {exc}") from None
        number += 1
        if any(cell.strip() for cell in row):
            yield number, row


def delimiter(text: str) -> str:
    """The delimiter among :data:`DELIMITERS` found most often outside quotes in the first
    row, blank lines before it skipped (the first of them on a tie, a comma when there is
    none)."""
    counts = dict.fromkeys(DELIMITERS, 0)
    quoted = False
    for ch in text[:_FIRST_ROW_SCAN].lstrip("\r\n"):
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch in "\r\n":
            break
        elif not quoted and ch in counts:
            counts[ch] += 1
    return max(DELIMITERS, key=lambda d: counts[d]) if any(counts.values()) else ","


def _layout(first: Sequence[str]) -> tuple[int, list[str], int]:
    """(address column, field names, 0 when the first row is a header else 1)."""
    cleaned = [cell.strip() for cell in first]
    for index, cell in enumerate(cleaned):
        if cell.lower() in EMAIL_HEADERS:
            names = [_name(c, i) for i, c in enumerate(cleaned)]
            return index, names, 0
    for index, cell in enumerate(cleaned):
        try:
            normalize_email(cell)
        except AddressError:
            continue
        return index, [f"field{i}" for i in range(len(cleaned))], 1
    raise CsvError("no column holds addresses: name it email in the first row")


def _name(cell: str, index: int) -> str:
    name = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in cell.lower())
    return name[:MAX_FIELD_NAME] or f"field{index}"


def _take(
    seen: set[str], row: Sequence[str], number: int, column: int, names: Sequence[str]
) -> Contact | Rejected:
    value = row[column].strip() if column < len(row) else ""
    try:
        email = normalize_email(value)
    except AddressError as exc:
        return Rejected(number, value[:320], str(exc) or "not an address")
    key = address_key(email)
    if key in seen:
        return Rejected(number, value[:320], "already in the file", "duplicate")
    seen.add(key)
    fields = {
        names[i] if i < len(names) else f"field{i}": cell.strip()[:MAX_FIELD_VALUE]
        for i, cell in enumerate(row)
        if i != column and cell.strip()
    }
    return Contact(email, dict(list(fields.items())[:MAX_FIELDS]), number)
