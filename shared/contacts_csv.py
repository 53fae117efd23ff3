"""Reading a contact list's CSV import (pure): which column holds the address, the other
columns as the contact's fields (its substitutions), and what is reported rather than
imported: invalid addresses (with row and reason), duplicates (the first one wins), and rows
past the limit. Suppressed and unsubscribed contacts are the store's to report: they are
valid rows here.

The first row is the header when one of its cells names the address column (``email``,
``e-mail``, ``email address``, ``address``); otherwise the column whose first cell is an
address is the address column, and the other columns are ``field1``, ``field2``...
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


@dataclass
class Imported:
    contacts: list[Contact] = field(default_factory=list)
    invalid: list[Rejected] = field(default_factory=list)
    duplicates: list[Rejected] = field(default_factory=list)
    over_limit: int = 0
    """Rows past the limit, not read."""


def read(data: bytes, *, max_rows: int) -> Imported:
    """Every contact of a CSV file (UTF-8, with or without BOM; comma, semicolon or tab)."""
    out = Imported()
    for item in scan(data, max_rows=max_rows):
        if isinstance(item, Contact):
            out.contacts.append(item)
        elif item.kind == "invalid":
            out.invalid.append(item)
        elif item.kind == "duplicate":
            out.duplicates.append(item)
        else:
            out.over_limit += 1
    return out


def check(data: bytes) -> None:
    """Raise :class:`CsvError` now for a file that cannot be imported at all (not UTF-8,
    empty, no address column), so that a request can be refused before it is queued."""
    next(scan(data, max_rows=1), None)


def scan(data: bytes, *, max_rows: int) -> Iterator[Contact | Rejected]:
    """:func:`read` one row at a time, in file order (a large file is never held as
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
    sample = text[:4096]
    try:
        dialect: type[csv.Dialect] | csv.Dialect = csv.Sniffer().sniff(sample, delimiters=",;\t")
    except csv.Error:
        dialect = csv.excel
    reader = csv.reader(io.StringIO(text), dialect)
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
