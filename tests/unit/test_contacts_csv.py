"""Reading contact lists' CSV imports (``shared.contacts_csv``)."""

from __future__ import annotations

import pytest

from shared.contacts_csv import Contact, CsvError, Rejected, read


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
    assert out.duplicates == [Rejected(4, "ANN@example.com", "already in the file")]


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
