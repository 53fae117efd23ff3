"""How :class:`services.api.contact_lists.ContactLists` cuts a slice of contacts into write batches
(``write_slices``, ``contact_size``): by count and by approximate bytes."""

from __future__ import annotations

from services.api.contact_lists import WRITE_BYTES, WRITE_SLICE, contact_size, write_slices
from services.api.contacts_csv import Contact


def test_small_contacts_are_cut_by_count() -> None:
    assert write_slices([100] * 45) == [range(20), range(20, 40), range(40, 45)]


def test_wide_contacts_are_cut_by_bytes_before_the_count() -> None:
    wide = contact_size(Contact("a@example.com", {f"f{j}": "x" * 1000 for j in range(50)}))

    runs = write_slices([wide] * WRITE_SLICE)

    assert sum(len(r) for r in runs) == WRITE_SLICE and len(runs) > 1
    assert all(len(r) * wide <= WRITE_BYTES for r in runs)


def test_a_contact_larger_than_the_limit_goes_alone() -> None:
    assert write_slices([10, 500, 10], limit=100) == [range(1), range(1, 2), range(2, 3)]


def test_nothing_to_write_is_no_batch() -> None:
    assert write_slices([]) == []


def test_a_contacts_size_counts_its_text_in_utf8() -> None:
    plain = contact_size(Contact("a@example.com", {"name": "Ann"}))

    assert contact_size(Contact("a@example.com", {"name": "Åsa"})) == plain + 1
