"""Reading contact lists' CSV imports (``services.api.contacts_csv``), as a stream."""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import pytest

from services.api.contacts_csv import (
    MAX_LINE,
    READ_CHUNK,
    Contact,
    CsvError,
    Rejected,
    RowError,
    _lines,
    check,
    count,
    delimiter,
    scan,
)


@dataclass
class Read:
    """What :func:`scan` yielded, sorted by kind."""

    contacts: list[Contact] = field(default_factory=list)
    invalid: list[Rejected] = field(default_factory=list)
    duplicates: list[Rejected] = field(default_factory=list)
    over_limit: int = 0


def read(data: bytes, max_rows: int = 10) -> Read:
    out = Read()
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


def test_a_header_names_the_address_column_and_the_fields() -> None:
    out = read(
        b"\xef\xbb\xbfFirst Name,E-mail,City\nAnn,ann@example.com,Oslo\nBob,bob@example.com,\n"
    )

    assert out.contacts == [
        Contact("ann@example.com", {"first_name": "Ann", "city": "Oslo"}),
        Contact("bob@example.com", {"first_name": "Bob"}),
    ]


def test_without_a_header_the_other_columns_are_named_by_their_position_from_0() -> None:
    out = read(b"Ann;ann@example.com;Oslo\nBob;bob@example.com;Bergen\n")

    assert [c.email for c in out.contacts] == ["ann@example.com", "bob@example.com"]
    assert out.contacts[0].fields == {"field0": "Ann", "field2": "Oslo"}


def test_invalid_rows_and_duplicates_are_reported_with_their_row() -> None:
    out = read(b"email\nann@example.com\nnot an address\nANN@example.com\n\nbob@example.com\n")

    assert [c.email for c in out.contacts] == ["ann@example.com", "bob@example.com"]
    assert [(r.row, r.value) for r in out.invalid] == [(3, "not an address")]
    assert out.duplicates == [Rejected(4, "ANN@example.com", "already in the file", "duplicate")]


def test_rows_past_the_limit_are_counted_not_read() -> None:
    body = b"email\n" + b"".join(b"r%d@example.com\n" % i for i in range(12))

    out = read(body, max_rows=10)

    assert (len(out.contacts), out.over_limit) == (10, 2)


@pytest.mark.parametrize(
    ("data", "problem"),
    [(b"", "empty"), (b"name,city\nAnn,Oslo\n", "no column"), (b"\xff\xfe\x00", "not UTF-8")],
)
def test_a_file_that_cannot_be_imported_says_why(data: bytes, problem: str) -> None:
    with pytest.raises(CsvError, match=problem):
        read(data)


def test_rows_are_numbered_as_a_spreadsheet_shows_them_blank_ones_included() -> None:
    out = read(b"email\nann@example.com\n\n,\nnot an address\nbob@example.com\n")

    assert [(c.email, c.row) for c in out.contacts] == [
        ("ann@example.com", 2),
        ("bob@example.com", 6),
    ]
    assert [r.row for r in out.invalid] == [5]


def test_scanning_yields_rows_in_file_order_with_what_became_of_each() -> None:
    items = list(scan(b"email\nann@example.com\nx\nann@example.com\nbob@example.com\n", max_rows=3))

    assert [(i.row, type(i).__name__, getattr(i, "kind", "")) for i in items] == [
        (2, "Contact", ""),
        (3, "Rejected", "invalid"),
        (4, "Rejected", "duplicate"),
        (5, "Rejected", "over_limit"),
    ]


def test_a_row_that_is_not_csv_is_an_error_naming_the_row() -> None:
    with pytest.raises(CsvError, match="row 3 is not CSV"):
        read(b'email\nann@example.com\n"' + b"x" * 200_000 + b'"\n')


def test_a_file_is_checked_by_its_first_row_only() -> None:
    check(b"email\nann@example.com\n")
    with pytest.raises(CsvError, match="no column"):
        check(b"name\nAnn\n")


# -- quoting: always CSV's own, whatever the first rows look like -----------------------------


def test_an_apostrophe_in_a_cell_is_text_not_a_quote() -> None:
    """A sniffer would take ``'`` for the quote character and merge cells."""
    out = read(
        b"email,venue,city\n"
        b"ann@example.com,Rock 'n' Roll Bar,Oslo\n"
        b"bob@example.com,O'Hara's,'Bergen'\n"
    )

    assert [c.fields for c in out.contacts] == [
        {"venue": "Rock 'n' Roll Bar", "city": "Oslo"},
        {"venue": "O'Hara's", "city": "'Bergen'"},
    ]


def test_doubled_quotes_are_a_quote_even_when_the_first_rows_have_none() -> None:
    rows = b"".join(b"u%d@example.com,Plain %d\n" % (i, i) for i in range(200))
    body = b"email,name\n" + rows + b'pat@example.com,"O""Brien, Pat"\n'

    out = read(body, max_rows=1000)

    assert out.contacts[-1] == Contact("pat@example.com", {"name": 'O"Brien, Pat'})
    assert not out.invalid


def test_a_quoted_cell_keeps_its_delimiters() -> None:
    out = read(b'name;email;note\n"Smith; John";john@example.com;"a, b; c"\n')

    assert out.contacts == [Contact("john@example.com", {"name": "Smith; John", "note": "a, b; c"})]


@pytest.mark.parametrize(
    ("first", "expected"),
    [
        ("email,name\n", ","),
        ("email;name;city\n", ";"),
        ("email\tname\n", "\t"),
        ('"Smith, Ann";ann@example.com\n', ";"),
        ("email\n", ","),
        ("\n\nemail;name\n", ";"),
        ("email;name,city\n", ","),
    ],
)
def test_the_delimiter_is_the_one_found_most_outside_quotes_in_the_first_row(
    first: str, expected: str
) -> None:
    assert delimiter(first + "a,b,c,d\n") == expected


# -- line ends ---------------------------------------------------------------------------------


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
def test_rows_may_end_in_lf_crlf_or_cr_alone(end: bytes) -> None:
    body = end.join([b"email,name", b"ann@example.com,Ann", b"", b"bob@example.com,Bob", b""])

    out = read(body)

    assert [(c.email, c.fields, c.row) for c in out.contacts] == [
        ("ann@example.com", {"name": "Ann"}, 2),
        ("bob@example.com", {"name": "Bob"}, 4),
    ]


def test_a_line_end_inside_quotes_stays_in_its_cell() -> None:
    out = read(b'email,address\r\nann@example.com,"1 Main St\r\nOslo"\r\nbob@example.com,x\r\n')

    assert [c.fields for c in out.contacts] == [{"address": "1 Main St\r\nOslo"}, {"address": "x"}]
    assert [c.row for c in out.contacts] == [2, 3]


# -- reading as a stream: a chunk of the file at a time ---------------------------------------


class Reading(io.BytesIO):
    """A file that remembers how far it has been read."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.furthest = 0

    def read(self, size: int | None = -1, /) -> bytes:
        out = super().read(size)
        self.furthest = max(self.furthest, self.tell())
        return out


def _rows(n: int) -> bytes:
    return b"email,name\n" + b"".join(b"r%07d@example.com,Person %d\n" % (i, i) for i in range(n))


def test_rows_are_read_from_the_file_as_they_are_taken() -> None:
    """Taking the first rows of a 3 MB file reads about a chunk of it, not all of it: the
    file is never held whole, as bytes or as text."""
    data = _rows(100_000)
    source = Reading(data)

    rows = scan(source, max_rows=200_000)
    first = [next(rows) for _ in range(10)]
    after_ten = source.furthest
    rest = sum(1 for _ in rows)

    assert [c.row for c in first] == list(range(2, 12))
    assert after_ten <= 2 * READ_CHUNK < len(data) // 10
    assert (rest, source.furthest) == (100_000 - 10, len(data))


def test_a_file_is_read_the_same_however_its_chunks_fall() -> None:
    """Line ends of every kind, a CRLF cut by a chunk's end, quoted line ends, a BOM."""
    data = (
        '\ufeffemail;name\r\nann@example.com;"Ann\r\nSmith"\rbob@example.com;Bob\r\n\r\n'
        'ché@example.com;Ché\ncat@example.com;"a;b"\r\n'
    ).encode()
    whole = list(scan(data, max_rows=10))

    for size in (1, 2, 3, 5, 7):
        assert list(scan(_chunked(data, size), max_rows=10)) == whole

    assert [(c.email, c.row) for c in whole if isinstance(c, Contact)] == [
        ("ann@example.com", 2),
        ("bob@example.com", 3),
        ("ché@example.com", 5),
        ("cat@example.com", 6),
    ]


def _chunked(data: bytes, size: int) -> Reading:
    """A file read ``size`` bytes at a time, whatever it is asked for."""

    class Small(Reading):
        def read(self, n: int | None = -1, /) -> bytes:
            return super().read(size)

    return Small(data)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 64])
def test_lines_are_cut_as_a_file_opened_without_newline_translation_cuts_them(
    size: int,
) -> None:
    text = 'a\r\nb\rc\n\n\r\r\nd"\r"e\r'
    parts = [text[i : i + size] for i in range(0, len(text), size)]

    assert list(_lines(parts)) == io.StringIO(text, newline="").readlines()


def test_a_line_longer_than_the_limit_is_a_row_that_is_not_csv() -> None:
    data = b"email\na@example.com\n" + b"x" * (MAX_LINE + 10)

    with pytest.raises(RowError, match="row 3 is not CSV: a line is longer"):
        read(data)


def test_a_byte_that_is_not_utf8_past_the_first_chunk_is_told_at_its_offset() -> None:
    head = _rows(10_000)
    data = head + b"bad\xffrow@example.com\n"

    with pytest.raises(CsvError, match=f"byte {len(head) + 3}"):
        count(data, limit=100_000)


def test_the_count_is_of_rows_past_the_header_blank_ones_aside() -> None:
    assert count(b"email\na@example.com\n\n,\nnot an address\n", limit=10) == 2
    assert count(b"a@example.com\nb@example.com\n", limit=10) == 2


def test_the_count_stops_past_the_limit_reading_no_further() -> None:
    source = Reading(_rows(100_000))

    assert count(source, limit=10) == 11
    assert source.furthest <= 2 * READ_CHUNK


def test_a_row_that_is_not_csv_ends_the_count_and_is_left_to_the_import() -> None:
    assert count(b'email\na@example.com\n"' + b"x" * 200_000 + b'"\nb@example.com\n', limit=9) == 1


@pytest.mark.parametrize(
    ("data", "problem"),
    [(b"", "empty"), (b"name,city\nAnn,Oslo\n", "no column"), (b"\xff\xfe\x00", "not UTF-8")],
)
def test_a_file_that_cannot_be_imported_cannot_be_counted(data: bytes, problem: str) -> None:
    with pytest.raises(CsvError, match=problem):
        count(data, limit=10)


def test_duplicates_are_found_among_many_addresses() -> None:
    """Past the table's growth: every address of the second pass is a duplicate."""
    first = b"".join(b"a%d@example.com\n" % i for i in range(20_000))

    out = read(b"email\n" + first + first.upper(), max_rows=100_000)

    assert (len(out.contacts), len(out.duplicates)) == (20_000, 20_000)
