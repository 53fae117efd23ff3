"""Where a recipient goes after a provider-side failure (pure parts of
``shared.delivery.handoff``)."""

from __future__ import annotations

from shared.delivery.handoff import excluded_providers, next_provider


def test_the_next_provider_follows_the_failed_one_in_the_chain() -> None:
    assert next_provider(("sg", "mg"), frozenset(), "sg") == "mg"


def test_the_chain_wraps_around_to_providers_before_the_failed_one() -> None:
    assert next_provider(("sg", "mg", "ses"), frozenset(), "ses") == "sg"


def test_providers_that_failed_the_recipient_on_their_side_are_never_tried_again() -> None:
    assert next_provider(("sg", "mg"), frozenset({"mg"}), "sg") is None


def test_excluded_are_the_providers_whose_entry_is_a_provider_side_failure() -> None:
    row = {"providers": {"sg": "dropped: Spam Content", "mg": "sent", "x": "deferred too long"}}
    assert excluded_providers(row) == frozenset({"sg", "x"})


def test_a_recipient_without_provider_entries_excludes_nobody() -> None:
    assert excluded_providers({"providers": None}) == frozenset()
