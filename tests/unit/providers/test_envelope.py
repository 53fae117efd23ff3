"""Provider-neutral chunk rules: validation, cc/bcc placement and substitutions."""

from __future__ import annotations

from typing import Any

import pytest

from shared.core.errors import PermanentProviderError
from shared.core.models import Address
from shared.providers import envelope
from tests.unit.providers.fakes import chunk, recipient

BOSS = Address(email="boss@example.com", name="Boss")
AUDIT = Address(email="audit@example.com")


def test_valid_chunk_passes() -> None:
    """A plain chunk raises nothing, even when its recipients are exactly the limit."""
    plain = chunk()

    envelope.check_chunk("sg", plain, 1000)  # raises nothing
    envelope.check_chunk("mg", plain, len(plain.recipients))  # raises nothing


def test_empty_chunk_is_refused() -> None:
    """A chunk without recipients is a permanent error."""
    empty = chunk().model_copy(update={"recipients": ()})

    with pytest.raises(PermanentProviderError, match="no recipients"):
        envelope.check_chunk("sg", empty, 1000)


def test_bulk_with_cc_is_refused() -> None:
    """cc together with bulk would copy every personalised message, so it is refused."""
    with pytest.raises(PermanentProviderError, match="bulk") as caught:
        envelope.check_chunk("mg", chunk(bulk=True, cc=[BOSS]), 1000)

    assert caught.value.provider == "mg"


def test_bulk_with_bcc_is_refused() -> None:
    """bcc together with bulk is refused like cc."""
    with pytest.raises(PermanentProviderError, match="bulk"):
        envelope.check_chunk("sg", chunk(bulk=True, bcc=[AUDIT]), 1000)


def test_recipient_limit_counts_cc_and_bcc() -> None:
    """to + cc + bcc above the provider's limit is refused before sending."""
    people = [recipient(f"u{i}@example.org") for i in range(2)]

    with pytest.raises(PermanentProviderError, match="3 recipients"):
        envelope.check_chunk("sg", chunk(people, cc=[BOSS]), 2)


def test_recipient_limit_ignores_cc_on_later_chunks() -> None:
    """Chunks after the first carry no cc/bcc, so only their recipients count."""
    people = [recipient(f"u{i}@example.org") for i in range(2)]
    later = chunk(people, index=1, cc=[BOSS])

    assert envelope.copies(later) == ((), ())
    envelope.check_chunk("sg", later, 2)  # raises nothing


@pytest.mark.parametrize(
    "name",
    [
        "To",
        "from",
        "BCC",
        "Reply-To",
        "Content-Type",
        "X-SG-ID",
        "X-Mailgun-Tag",
        "X-SMTPAPI",
        "Resent-From",
        "authentication-results",
        "ARC-Seal",
    ],
)
def test_reserved_header_is_refused(name: str) -> None:
    """Headers SendGrid reserves are refused for every provider, case-insensitively."""
    with pytest.raises(PermanentProviderError, match="may not be set"):
        envelope.check_chunk("mg", chunk(headers={name: "x"}), 1000)


def test_our_unsubscribe_headers_pass_the_last_line_of_defence() -> None:
    """Requests may not set List-Unsubscribe(-Post), but the copies we personalise carry them."""
    ours = chunk(headers={"List-Unsubscribe-Post": "List-Unsubscribe=One-Click"})

    envelope.check_chunk("sg", ours, 1000)  # raises nothing


def test_header_value_with_newline_is_refused() -> None:
    """A CR/LF in a header value (header injection) is refused."""
    with pytest.raises(PermanentProviderError, match="invalid name or value"):
        envelope.check_chunk("sg", chunk(headers={"X-Campaign": "a\r\nBcc: evil@x"}), 1000)


def test_header_name_with_colon_is_refused() -> None:
    """A header name that is not a header token is refused."""
    with pytest.raises(PermanentProviderError, match="invalid name"):
        envelope.check_chunk("sg", chunk(headers={"X-A: b": "x"}), 1000)


@pytest.mark.parametrize(
    "fields",
    [
        {"subject": "Hi\r\nBcc: evil@example.com"},
        {"sender": Address(email="a@example.com", name="A\nB")},
        {"reply_to": Address(email="r@example.com", name="R\rX")},
        {"categories": ["ok", "bad\n"]},
    ],
)
def test_newline_in_header_bound_field_is_refused(fields: dict[str, Any]) -> None:
    """CR, LF or NUL in the subject, a name or a category is refused."""
    with pytest.raises(PermanentProviderError, match="CR, LF or NUL"):
        envelope.check_chunk("sg", chunk(**fields), 1000)


def test_newline_in_recipient_name_is_refused() -> None:
    """A recipient name carrying a newline is refused."""
    with pytest.raises(PermanentProviderError, match="CR, LF or NUL"):
        envelope.check_chunk("sg", chunk([recipient("a@example.org", "A\r\nB")]), 1000)


def test_copies_ride_on_chunk_zero() -> None:
    """Chunk 0 of a shared message carries cc and bcc."""
    assert envelope.copies(chunk(cc=[BOSS], bcc=[AUDIT])) == ((BOSS,), (AUDIT,))


def test_later_chunks_carry_no_copies() -> None:
    """Other chunks carry no cc/bcc, so each copy is sent once per batch."""
    assert envelope.copies(chunk(index=2, cc=[BOSS], bcc=[AUDIT])) == ((), ())


def test_copies_skip_recipients_and_repeats() -> None:
    """cc/bcc addresses already in to, or already in cc, are dropped case-insensitively."""
    people = [recipient("Boss@Example.com")]
    again = Address(email="AUDIT@example.com")

    cc, bcc = envelope.copies(chunk(people, cc=[BOSS, AUDIT], bcc=[again]))

    assert (cc, bcc) == ((AUDIT,), ())


def test_shared_substitutions_keep_common_pairs() -> None:
    """Only key/value pairs every recipient shares are kept."""
    people = [
        recipient("a@example.org", substitutions={"-team-": "red", "-city-": "Oslo"}),
        recipient("b@example.org", substitutions={"-team-": "red", "-city-": "Rome"}),
    ]

    assert envelope.shared_substitutions(people) == {"-team-": "red"}


def test_shared_substitutions_of_one_recipient_are_its_own() -> None:
    """A single recipient keeps all of its substitutions."""
    assert envelope.shared_substitutions(
        [recipient("a@example.org", substitutions={"x": "1"})]
    ) == {"x": "1"}


def test_shared_substitutions_of_nobody_are_empty() -> None:
    """No recipients means no substitutions."""
    assert envelope.shared_substitutions([]) == {}


def test_replace_keys_prefers_longest_key() -> None:
    """Overlapping keys resolve to the longest match, in one pass."""
    text = envelope.replace_keys("-first- -first-name-", {"-first-": "A", "-first-name-": "B"})

    assert text == "A B"


def test_replace_keys_does_not_rescan_replacements() -> None:
    """A replacement containing another key is not replaced again."""
    assert envelope.replace_keys("%a%", {"%a%": "%b%", "%b%": "x"}) == "%b%"


def test_replace_keys_ignores_empty_keys() -> None:
    """An empty key never matches."""
    assert envelope.replace_keys("abc", {"": "x"}) == "abc"
