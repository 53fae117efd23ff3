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
from typing import Final

from shared.addresses import AddressError, address_key, normalize_email

#: Header names taken for the address column (compared in lower case, trimmed).
EMAIL_HEADERS: Final = frozenset({"email", "e-mail", "email address", "e-mail address", "address"})
#: Longest field name and value kept.
MAX_FIELD_NAME: Final = 64
MAX_FIELD_VALUE: Final = 1_000
#: Fields kept per contact.
MAX_FIELDS: Final = 50


class CsvError(ValueError):
    """A file that cannot be imported at all (no address column, not text)."""


@dataclass(frozen=True, slots=True)
class Contact:
    email: str
    fields: dict[str, str]


@dataclass(frozen=True, slots=True)
class Rejected:
    row: int
    """1-based, as a spreadsheet numbers it (the header is row 1)."""
    value: str
    reason: str


@dataclass
class Imported:
    contacts: list[Contact] = field(default_factory=list)
    invalid: list[Rejected] = field(default_factory=list)
    duplicates: list[Rejected] = field(default_factory=list)
    over_limit: int = 0
    """Rows past the limit, not read."""


def read(data: bytes, *, max_rows: int) -> Imported:
    """Every contact of a CSV file (UTF-8, with or without BOM; comma, semicolon or tab)."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CsvError(f"the file is not UTF-8 text (byte {exc.start})") from None
    rows = _rows(text)
    first = next(rows, None)
    if first is None:
        raise CsvError("the file is empty")
    column, names, start = _layout(first)
    out = Imported()
    seen: set[str] = set()
    if start == 1:
        _take(out, seen, first, 1, column, names, max_rows)
    for number, row in enumerate(rows, start=2):
        _take(out, seen, row, number, column, names, max_rows)
    return out


def _rows(text: str) -> Iterator[list[str]]:
    sample = text[:4096]
    try:
        dialect: type[csv.Dialect] | csv.Dialect = csv.Sniffer().sniff(sample, delimiters=",;\t")
    except csv.Error:
        dialect = csv.excel
    for row in csv.reader(io.StringIO(text), dialect):
        if any(cell.strip() for cell in row):
            yield row


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
    out: Imported,
    seen: set[str],
    row: Sequence[str],
    number: int,
    column: int,
    names: Sequence[str],
    max_rows: int,
) -> None:
    if len(out.contacts) + len(out.invalid) + len(out.duplicates) >= max_rows:
        out.over_limit += 1
        return
    value = row[column].strip() if column < len(row) else ""
    try:
        email = normalize_email(value)
    except AddressError as exc:
        out.invalid.append(Rejected(number, value[:320], str(exc) or "not an address"))
        return
    key = address_key(email)
    if key in seen:
        out.duplicates.append(Rejected(number, value[:320], "already in the file"))
        return
    seen.add(key)
    fields = {
        names[i] if i < len(names) else f"field{i}": cell.strip()[:MAX_FIELD_VALUE]
        for i, cell in enumerate(row)
        if i != column and cell.strip()
    }
    out.contacts.append(Contact(email, dict(list(fields.items())[:MAX_FIELDS])))
