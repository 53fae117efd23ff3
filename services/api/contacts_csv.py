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

A file is read as a stream: a chunk of bytes at a time, decoded and cut into lines as it
goes, so reading it holds about a chunk and a row however large the file is. Only what finds
duplicates grows with it: a digest of each address read (:class:`_Seen`), about 16 bytes.
"""

from __future__ import annotations

import codecs
import csv
import io
import itertools
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Final, Literal

from shared.core.addresses import AddressError, address_key, normalize_email

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
#: Bytes read from the file at a time.
READ_CHUNK: Final = 64 * 1024
#: Longest line read (characters): far past the longest cell the csv module takes (131,072).
MAX_LINE: Final = 1024 * 1024

#: A file: its bytes, or a binary file read from where it stands.
Source = bytes | IO[bytes]


class CsvError(ValueError):
    """A file that cannot be imported at all (no address column, not text, not CSV)."""


class RowError(CsvError):
    """A row that is not CSV (a NUL byte, an oversized cell): the rows before it are read."""


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


def check(source: Source) -> None:
    """Raise :class:`CsvError` now for a file that cannot be imported at all (empty, no
    address column, its first row not UTF-8), so that a request can be refused before it is
    queued. A file object is read from where it is (rewind it after)."""
    next(scan(source, max_rows=1), None)


def count(source: Source, *, limit: int) -> int:
    """The rows :func:`scan` reads past the header (blank ones aside), counted up to
    ``limit + 1`` at most (a file with more stops there), reading the file as a stream.

    Raises:
        CsvError: when the file cannot be imported at all, as :func:`check`, or a byte that
            is not UTF-8 comes before the count ends. A row that is not CSV ends the count
            (the import reports it, after the rows before it).
    """
    rows = _rows(source)
    first = next(rows, None)
    if first is None:
        raise CsvError("the file is empty")
    found = _layout(first[1])[2]
    try:
        for _ in rows:
            if found > limit:
                break
            found += 1
    except RowError:
        pass
    return found


def scan(source: Source, *, max_rows: int) -> Iterator[Contact | Rejected]:
    """Every row of a CSV file (UTF-8, with or without BOM; comma, semicolon or tab) as a
    contact or as rejected, one at a time in file order, read as a stream (a large file is
    never held, as bytes, text or contacts). Rows past ``max_rows`` come as rejected with the
    kind ``over_limit``.

    Raises:
        CsvError: when the file cannot be imported at all, or (while iterating) a byte is not
            UTF-8 or a row is not CSV (:class:`RowError`: a NUL byte, an oversized field).
    """
    rows = _rows(source)
    first = next(rows, None)
    if first is None:
        raise CsvError("the file is empty")
    number, head = first
    column, names, start = _layout(head)
    seen = _Seen()
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


def _rows(source: Source) -> Iterator[tuple[int, list[str]]]:
    """Each non-blank row with its number (blank rows are numbered too, as a spreadsheet
    shows them)."""
    text = _decoded(io.BytesIO(source) if isinstance(source, bytes) else source)
    head = _head(text)
    # Lines as a file opened with newline="" gives them: the csv module sees line ends as
    # they are (a CR alone ends a row, a line end inside quotes stays in its cell).
    lines = _lines(itertools.chain((head,), text))
    reader = csv.reader(lines, csv.excel, delimiter=delimiter(head))
    number = 0
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise RowError(f"row {number + 1} is not CSV: {exc}") from None
        number += 1
        if any(cell.strip() for cell in row):
            yield number, row


def _decoded(source: IO[bytes]) -> Iterator[str]:
    """The file's text, a chunk at a time (UTF-8; a leading BOM dropped). A byte that is
    not UTF-8 is told by its offset in the file."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    fed = 0
    first = True
    while True:
        chunk = source.read(READ_CHUNK)
        pending = len(decoder.getstate()[0])  # bytes of a character the last chunk cut
        try:
            text = decoder.decode(chunk, final=not chunk)
        except UnicodeDecodeError as exc:
            at = fed - pending + exc.start
            raise CsvError(f"the file is not UTF-8 text (byte {at})") from None
        fed += len(chunk)
        if first and text:
            text = text.removeprefix("\ufeff")
            first = False
        if text:
            yield text
        if not chunk:
            return


def _head(text: Iterator[str]) -> str:
    """The file's first :data:`_FIRST_ROW_SCAN` characters or more (all of a shorter file),
    taken from ``text``: what :func:`delimiter` looks at."""
    parts: list[str] = []
    size = 0
    for part in text:
        parts.append(part)
        size += len(part)
        if size >= _FIRST_ROW_SCAN:
            break
    return "".join(parts)


def _lines(chunks: Iterable[str]) -> Iterator[str]:
    """``chunks`` cut into lines, each with its end (LF, CRLF or CR alone), as
    ``io.StringIO(whole, newline="")`` cuts them: never a CRLF cut in two at a chunk's end.

    Raises:
        csv.Error: for a line longer than :data:`MAX_LINE` characters (never held whole).
    """
    held: list[str] = []
    size = 0
    for chunk in chunks:
        if held and held[-1].endswith("\r"):
            # The line ended in a CR at the last chunk's end: an LF here is its CRLF's.
            if chunk.startswith("\n"):
                held.append("\n")
                chunk = chunk[1:]
            yield "".join(held)
            held, size = [], 0
        lines = io.StringIO(chunk, newline="").readlines()
        if not lines:
            continue
        last = lines.pop()
        if held and lines:
            lines[0] = "".join(held) + lines[0]
            held, size = [], 0
        yield from lines
        held.append(last)
        size += len(last)
        if last.endswith("\n"):
            yield "".join(held)
            held, size = [], 0
        elif size > MAX_LINE:
            raise csv.Error(f"a line is longer than {MAX_LINE:,} characters")
    if held:
        yield "".join(held)


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
    seen: _Seen, row: Sequence[str], number: int, column: int, names: Sequence[str]
) -> Contact | Rejected:
    value = row[column].strip() if column < len(row) else ""
    try:
        email = normalize_email(value)
    except AddressError as exc:
        return Rejected(number, value[:320], str(exc) or "not an address")
    if not seen.add(address_key(email)):
        return Rejected(number, value[:320], "already in the file", "duplicate")
    fields = {
        names[i] if i < len(names) else f"field{i}": cell.strip()[:MAX_FIELD_VALUE]
        for i, cell in enumerate(row)
        if i != column and cell.strip()
    }
    return Contact(email, dict(list(fields.items())[:MAX_FIELDS]), number)


class _Seen:
    """The addresses read so far, as 64-bit digests (``hash``: SipHash, keyed per process) in
    an open-addressed table at most half full: about 16 bytes an address however long it is,
    where a set of the strings takes over 100. Two addresses of one file sharing a digest
    (odds about n²/2⁶⁵: once in 30 million files of a million rows) would report the second
    as a duplicate."""

    __slots__ = ("slots", "used")

    def __init__(self) -> None:
        self.slots = array("Q", bytes(8 * 1024))
        self.used = 0

    def add(self, key: str) -> bool:
        """Whether ``key`` is new (it is kept)."""
        digest = (hash(key) & 0xFFFF_FFFF_FFFF_FFFF) | 1  # 0 marks a free slot
        slots = self.slots
        mask = len(slots) - 1
        at = digest & mask
        while found := slots[at]:  # linear probing
            if found == digest:
                return False
            at = (at + 1) & mask
        slots[at] = digest
        self.used += 1
        if self.used * 2 > len(slots):
            self._grow()
        return True

    def _grow(self) -> None:
        old = self.slots
        self.slots = array("Q", bytes(16 * len(old)))
        self.used = 0
        for digest in old:
            if digest:
                self._keep(digest)

    def _keep(self, digest: int) -> None:
        slots = self.slots
        mask = len(slots) - 1
        at = digest & mask
        while slots[at]:
            at = (at + 1) & mask
        slots[at] = digest
        self.used += 1
