"""Who may lift a suppression (``shared.audience.suppressions``, ``services.api.managing``): the
recipient's own unsubscribe or complaint only an operator; a sender what they added and
bounces. Over the suppression store's twin."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from services.api.managing import Managing
from shared.audience.suppressions import by_recipient, lift_refusal, made_by_recipient
from shared.infra.http import ApiError
from tests.fakes.audience import FakeSuppressionStore
from tests.fakes.cassandra import FakeCassandra

ANN = "ann@example.org"


@pytest.mark.parametrize(
    ("kind", "raw", "reason", "mark"),
    [
        ("unsubscribed", "unsubscribe", None, "unsubscribed"),
        ("unsubscribed", "group_unsubscribe", None, "unsubscribed"),
        ("unsubscribed", "one-click unsubscribe", None, "unsubscribed"),
        ("complained", "spamreport", None, "complained"),
        ("complained", "complained", None, "complained"),
        ("dropped", "dropped", "Unsubscribed Address", "unsubscribed"),
        ("dropped", "dropped", "Spam Reporting Address", "complained"),
        ("dropped", "failed/permanent/suppress-unsubscribe", "550 x", "unsubscribed"),
        ("dropped", "failed/permanent/suppress-complaint", None, "complained"),
        ("dropped", "dropped", "Bounced Address", None),
        ("dropped", "dropped", "Invalid", None),
        ("dropped", "failed/permanent/suppress-bounce", None, None),
        ("bounced", "bounce", "550 5.1.1 unknown user", None),
        ("bounced", "failed/permanent/bounce", None, None),
    ],
)
def test_the_recipients_own_acts_are_told_apart_from_bounces(
    kind: str, raw: str, reason: str | None, mark: str | None
) -> None:
    """Unsubscribes and complaints, and a provider's drop for its list of either, are the
    recipient's; bounces, and drops for a bounce list, are not."""
    assert by_recipient(kind, raw, reason) == mark


@pytest.mark.parametrize(
    ("source", "reason", "made"),
    [
        ("tracking", "one-click unsubscribe", "unsubscribed"),
        ("sg", "unsubscribe", "unsubscribed"),
        ("sg", "group_unsubscribe", "unsubscribed"),
        ("sg", "spamreport", "complained"),
        ("mg", "complained", "complained"),
        ("mg", "unsubscribed", "unsubscribed"),
        ("mg", "failed/permanent/suppress-complaint", "complained"),
        ("sg", "dropped", "provider_list"),
        ("sg", "bounce/bounce", None),
        ("mg", "failed/permanent/bounce", None),
        ("mg", "failed/permanent/suppress-bounce", None),
        ("api", "unsubscribed", None),
        ("dashboard", "spamreport", None),
    ],
)
def test_an_entry_from_before_marks_is_judged_by_its_source_and_reason(
    source: str, reason: str, made: str | None
) -> None:
    """Without a mark, a provider's or our tracker's unsubscribe or complaint is the
    recipient's; a SendGrid drop (its reason not kept) counts as theirs; what a sender typed
    is theirs whatever its reason says."""
    assert made_by_recipient({"source": source, "reason": reason, "by_recipient": None}) == made


def test_a_mark_decides_over_source_and_reason() -> None:
    """A sender's own write over a recipient's entry does not make it the sender's."""
    entry = {"source": "api", "reason": "manual", "by_recipient": "complained"}

    assert made_by_recipient(entry) == "complained"


def test_only_an_operator_may_lift_what_the_recipient_made() -> None:
    """The refusal names the address and why; an operator is not refused, nor anyone for a
    bounce or a sender's own entry."""
    theirs: dict[str, Any] = {"email": ANN, "source": "sg", "reason": "spamreport"}
    bounce: dict[str, Any] = {"email": ANN, "source": "sg", "reason": "bounce/bounce"}

    refusal = lift_refusal(theirs, operator=False)

    assert refusal is not None and ANN in refusal and "spam" in refusal
    assert "operator" in refusal
    assert lift_refusal(theirs, operator=True) is None
    assert lift_refusal(bounce, operator=False) is None
    assert lift_refusal({"email": ANN, "source": "api", "reason": "x"}, operator=False) is None


def _managing(store: FakeSuppressionStore) -> Managing:
    return Managing(FakeCassandra(), store)  # type: ignore[arg-type]


async def test_a_send_key_cannot_delete_an_unsubscribe_and_it_stays() -> None:
    """403 ``suppressed_by_recipient`` naming why; the address stays suppressed."""
    store, user = FakeSuppressionStore(), uuid.uuid4()
    await store.add(user, ANN, reason="unsubscribe", source="sg", by_recipient="unsubscribed")

    with pytest.raises(ApiError) as refused:
        await _managing(store).unsuppress(user, ANN)

    assert (refused.value.status, refused.value.code) == (403, "suppressed_by_recipient")
    assert "unsubscribed" in refused.value.message
    assert await store.suppressed(user, [ANN]) == {ANN: "unsubscribe"}


async def test_a_list_unsubscribe_is_the_recipients_too() -> None:
    """An unsubscribe from one list (``?list=``) is refused to a sender the same way."""
    store, user = FakeSuppressionStore(), uuid.uuid4()
    await store.add(
        user,
        ANN,
        reason="one-click unsubscribe",
        source="tracking",
        scope="news",
        by_recipient="unsubscribed",
    )

    with pytest.raises(ApiError):
        await _managing(store).unsuppress(user, ANN, "news")

    assert await store.entry(user, ANN, "news") is not None


async def test_an_operator_may_lift_a_complaint() -> None:
    store, user = FakeSuppressionStore(), uuid.uuid4()
    await store.add(user, ANN, reason="spamreport", source="sg", by_recipient="complained")

    assert await _managing(store).unsuppress(user, ANN, operator=True) is True
    assert await store.entry(user, ANN) is None


@pytest.mark.parametrize(
    ("reason", "source"), [("manual", "api"), ("manual", "dashboard"), ("bounce/bounce", "sg")]
)
async def test_a_sender_lifts_what_they_added_and_bounces(reason: str, source: str) -> None:
    store, user = FakeSuppressionStore(), uuid.uuid4()
    await store.add(user, ANN, reason=reason, source=source)

    assert await _managing(store).unsuppress(user, ANN) is True
    assert await store.suppressed(user, [ANN]) == {}


async def test_re_adding_an_unsubscribed_address_by_hand_does_not_make_it_the_senders() -> None:
    """POST /v1/suppressions over an entry the recipient made (one from before marks too)
    keeps it theirs: the delete that follows is still refused."""
    store, user = FakeSuppressionStore(), uuid.uuid4()
    await store.add(user, ANN, reason="one-click unsubscribe", source="tracking")  # no mark
    managing = _managing(store)

    await managing.suppress(user, ANN, "manual", source="api")

    with pytest.raises(ApiError, match="unsubscribed"):
        await managing.unsuppress(user, ANN)
    assert await store.suppressed(user, [ANN]) == {ANN: "manual"}


class _UnsubscribedMeanwhile(FakeSuppressionStore):
    """The recipient unsubscribes between the sender's check and their delete."""

    async def forget(
        self, user_id: uuid.UUID, email: str, scope: str | None = None, *, version: int
    ) -> None:
        await self.add(
            user_id,
            email,
            reason="one-click unsubscribe",
            source="tracking",
            by_recipient="unsubscribed",
        )
        await super().forget(user_id, email, scope, version=version)


async def test_an_unsubscribe_landing_during_a_senders_delete_survives_it() -> None:
    """The delete removes the entry as it was checked (the sender's own), never the
    recipient's newer one."""
    store, user = _UnsubscribedMeanwhile(), uuid.uuid4()
    await store.add(user, ANN, reason="manual", source="api")

    assert await _managing(store).unsuppress(user, ANN) is True

    kept = await store.entry(user, ANN)
    assert kept is not None and kept["by_recipient"] == "unsubscribed"
