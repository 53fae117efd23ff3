"""Reading contact lists' CSV imports (``shared.contacts_csv``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from shared.contacts_csv import Contact, CsvError, Rejected, check, delimiter, scan


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
