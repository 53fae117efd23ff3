"""Reading contact lists' CSV imports (``shared.contacts_csv``)."""

from __future__ import annotations

import pytest

from shared.contacts_csv import Contact, CsvError, Rejected, check, read, scan


def test_a_header_names_the_address_column_and_the_fields() -> None:
    out = read(
        b"\xef\xbb\xbfFirst Name,E-mail,City\nAnn,ann@example.com,Oslo\nBob,bob@example.com,\n",
        max_rows=10,
    )

    assert out.contacts == [
        Contact("ann@example.com", {"first_name": "Ann", "city": "Oslo"}),
        Contact("bob@example.com", {"first_name": "Bob"}),
    ]


def test_without_a_header_the_column_of_addresses_is_found() -> None:
    out = read(b"Ann;ann@example.com\nBob;bob@example.com\n", max_rows=10)

    assert [c.email for c in out.contacts] == ["ann@example.com", "bob@example.com"]
    assert out.contacts[0].fields == {"field0": "Ann"}


def test_invalid_rows_and_duplicates_are_reported_with_their_row() -> None:
    out = read(
        b"email\nann@example.com\nnot an address\nANN@example.com\n\nbob@example.com\n",
        max_rows=10,
    )

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
        read(data, max_rows=10)


def test_rows_are_numbered_as_a_spreadsheet_shows_them_blank_ones_included() -> None:
    out = read(b"email\nann@example.com\n\n,\nnot an address\nbob@example.com\n", max_rows=10)

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
        read(b'email\nann@example.com\n"' + b"x" * 200_000 + b'"\n', max_rows=10)


def test_a_file_is_checked_by_its_first_row_only() -> None:
    check(b"email\nann@example.com\n")
    with pytest.raises(CsvError, match="no column"):
        check(b"name\nAnn\n")
