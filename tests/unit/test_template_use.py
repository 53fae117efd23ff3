"""Template batches (pure): one render per batch, per-recipient variables as provider
substitutions (escaped in html), refusal of transformed per-recipient variables, the canary's
recipients first in chunks of their own, and which version each chunk carries."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from services.consumers.canary_judge import count
from shared.core.models import Address, Message, TemplateCopy
from shared.delivery.batchstore import NewBatch
from shared.delivery.validation import RecipientInput
from shared.templates import template_use
from shared.templates.canary import in_canary
from shared.templates.template_render import RenderError
from shared.templates.template_use import Source, TemplateState

SOURCE = Source(3, "Hi {{ name }}", "<p>{{ name }} at {{ shop }}</p>", None)


def test_variables_not_in_data_are_per_recipient() -> None:
    assert template_use.per_recipient(SOURCE, {"shop": "A"}) == {"name"}


def test_per_recipient_variables_render_as_markers_of_their_part() -> None:
    copy = template_use.render_once(SOURCE, {"shop": "A & B"}, {"name"})

    assert copy.subject == "Hi [[sd.t.name]]"
    assert copy.html == "<p>[[sd.h.name]] at A &amp; B</p>"
    assert copy.text is not None and "[[sd.t.name]] at A & B" in copy.text
    assert copy.version == 3


def test_a_recipients_value_is_escaped_for_html_and_kept_for_text() -> None:
    subs = template_use.recipient_substitutions({"name": "<b>Ann</b>"}, {"name"})

    assert subs == {"[[sd.t.name]]": "<b>Ann</b>", "[[sd.h.name]]": "&lt;b&gt;Ann&lt;/b&gt;"}


def test_a_transformed_per_recipient_variable_is_refused_by_name() -> None:
    source = Source(1, "Hi {{ name|upper }}", None, "x")

    with pytest.raises(RenderError, match="per-recipient"):
        template_use.render_once(source, {}, {"name"})


@pytest.mark.parametrize(
    "html",
    [
        "{% if vip %}VIP{% endif %}",
        "{{ name|length }}",
        "{{ name[0] }}",
        "{{ 'pro' if plan == 'pro' else 'free' }}",
        "{% for c in name %}{{ c }}{% endfor %}",
        "{{ name|truncate(5, True, '') }}",
    ],
)
def test_deciding_on_a_per_recipient_variable_is_refused_not_rendered_wrong(html: str) -> None:
    """Its value is only known to the provider: a test, comparison or length taken of the
    marker would give every recipient the same wrong text."""
    with pytest.raises(RenderError, match="per-recipient variable"):
        template_use.render_once(Source(1, "Hi", html, None), {}, {"name", "vip", "plan"})


def test_a_per_recipient_variable_joined_to_text_stays_a_marker() -> None:
    copy = template_use.render_once(Source(1, "{{ 'Dear ' ~ name }}", None, "x"), {}, {"name"})

    assert copy.subject == "Dear [[sd.t.name]]"


def test_a_variable_name_a_recipient_cannot_fill_is_refused() -> None:
    with pytest.raises(RenderError, match="not a variable name"):
        template_use.render_once(Source(1, "x", None, "y"), {}, {"bad]]name"})


def test_a_template_that_does_not_parse_is_a_render_error() -> None:
    with pytest.raises(RenderError, match="line 1"):
        template_use.per_recipient(Source(1, "{% if %}", None, None), {})


def test_the_canary_recipients_come_first_and_stay_the_same() -> None:
    tid = uuid.uuid1()
    emails = [f"r{i}@example.com" for i in range(200)]

    order, inside = template_use.canary_first(tid, emails, 30)

    assert sorted(order) == list(range(200))
    assert all(in_canary(tid, emails[i], 30) for i in order[:inside])
    assert not any(in_canary(tid, emails[i], 30) for i in order[inside:])
    assert template_use.canary_first(tid, emails, 30) == (order, inside)


def _message() -> Message:
    return Message(sender=Address(email="s@example.com"), subject="live", text="live")


def test_the_canary_chunks_carry_the_canary_and_the_rest_the_live_version() -> None:
    live = TemplateCopy(version=1, subject="live", text="live")
    canary = TemplateCopy(version=2, subject="canary", text="canary")
    use = template_use.use_of(uuid.uuid1(), live, canary, canary_recipients=3, chunk_size=2)
    message = _message().model_copy(update={"template": use})

    assert use.canary_chunks == 2
    assert [template_use.message_for(message, c).subject for c in range(4)] == [
        "canary",
        "canary",
        "live",
        "live",
    ]
    assert [template_use.version_for(message, c) for c in range(3)] == [2, 2, 1]
    assert template_use.version_for(_message(), 0) is None


def test_a_canary_without_recipients_is_no_canary() -> None:
    live = TemplateCopy(version=1, subject="live")
    use = template_use.use_of(uuid.uuid1(), live, live, canary_recipients=0, chunk_size=2)

    assert use.canary is None and use.canary_chunks == 0


def test_a_template_batch_message_survives_its_codec_and_others_omit_it() -> None:
    live = TemplateCopy(version=1, subject="live")
    message = _message().model_copy(
        update={"template": template_use.use_of(uuid.uuid1(), live, None, 0, 10)}
    )

    assert Message.decode(message.encode()) == message
    assert b"template" not in _message().encode()


def test_no_chunk_mixes_the_canary_and_the_rest() -> None:
    people = [RecipientInput(email=f"r{i}@example.com") for i in range(7)]
    batch = NewBatch(uuid.uuid1(), uuid.uuid4(), _message(), people, chunk_size=3, split=4)

    assert [len(c) for c in batch.chunks()] == [3, 1, 3]
    assert batch.chunk_count == 3
    assert [batch.chunk_of(i) for i in range(7)] == [0, 0, 0, 1, 2, 2, 2]


def test_the_judge_counts_each_side_on_what_harms_a_sender() -> None:
    tally = count(
        [
            (True, "delivered"),
            (True, "bounced"),
            (True, "queued"),  # not sent yet: not counted
            (False, "dropped"),
            (False, "failed"),
            (False, "complained"),
            (False, None),
        ]
    )

    assert (tally.canary.sent, tally.canary.hard_bounces) == (2, 1)
    assert (tally.live.sent, tally.live.provider_failures, tally.live.complaints) == (3, 2, 1)


_SINCE = datetime(2026, 11, 30, 2, 0, tzinfo=UTC)


def _canary_message() -> Message:
    """A batch of 4 chunks from template v1 with canary v2 (rollout since _SINCE) in 2."""
    live = TemplateCopy(version=1, subject="live", text="live")
    canary = TemplateCopy(version=2, subject="canary", text="canary")
    use = template_use.use_of(
        uuid.uuid1(), live, canary, canary_recipients=3, chunk_size=2, since=_SINCE
    )
    return _message().model_copy(update={"template": use})


def _sent(rollout: TemplateState | None, kept: int | None = None) -> list[int | None]:
    message = _canary_message()
    return [template_use.version_at_send(message, c, rollout, kept) for c in range(4)]


def test_canary_chunks_go_with_the_canary_while_it_is_the_templates_canary() -> None:
    assert _sent(TemplateState(live=1, canary=2, canary_since=_SINCE)) == [2, 2, 1, 1]


def test_canary_chunks_go_with_the_live_copy_once_the_canary_is_rolled_back() -> None:
    assert _sent(TemplateState(live=1)) == [1, 1, 1, 1]


def test_canary_chunks_keep_the_canary_once_it_is_promoted() -> None:
    assert _sent(TemplateState(live=2)) == [2, 2, 1, 1]


def test_canary_chunks_go_with_the_live_copy_once_another_rollout_replaced_theirs() -> None:
    again = _SINCE + timedelta(minutes=5)

    assert _sent(TemplateState(live=1, canary=2, canary_since=again)) == [1, 1, 1, 1]
    assert _sent(TemplateState(live=1, canary=3, canary_since=again)) == [1, 1, 1, 1]


def test_canary_chunks_go_with_the_live_copy_once_the_template_is_deleted() -> None:
    assert _sent(None) == [1, 1, 1, 1]


def test_a_call_that_may_have_reached_the_provider_keeps_its_version() -> None:
    assert _sent(TemplateState(live=1), kept=2) == [2, 2, 2, 2]
    assert _sent(TemplateState(live=1, canary=2, canary_since=_SINCE), kept=1) == [1, 1, 1, 1]


def test_a_batch_not_from_a_template_has_no_version() -> None:
    assert template_use.version_at_send(_message(), 0, TemplateState(live=1)) is None
    assert template_use.message_at(_message(), 0, None) == _message()


def test_only_calls_that_may_have_reached_the_provider_are_kept() -> None:
    assert template_use.kept_version([("rejected", 2), ("calling", 2)]) is None
    assert template_use.kept_version([("ambiguous", 2)]) == 2
    assert template_use.kept_version([("resolved", 2), ("rejected", 1), ("ambiguous", 1)]) == 1
    assert template_use.kept_version([("resolved", None)]) is None


def test_the_message_is_the_copy_of_the_version_sent() -> None:
    message = _canary_message()

    assert template_use.message_at(message, 0, 2).subject == "canary"
    assert template_use.message_at(message, 0, 1).subject == "live"
    assert template_use.message_at(message, 3, 2).subject == "canary"


def test_an_attempt_without_a_version_sends_the_copy_the_batch_meant() -> None:
    message = _canary_message()

    assert [template_use.message_at(message, c, None).subject for c in (0, 2)] == [
        "canary",
        "live",
    ]


def test_a_recipient_got_the_version_of_the_attempt_that_took_it() -> None:
    chunk_line = {0: 2, 1: 1}

    assert template_use.version_sent(["c.1"], chunk_line, {}, 2) == 1
    assert template_use.version_sent(["c.0"], chunk_line, {}, 1) == 2
    assert template_use.version_sent(["c.0", "r.0", "r.1"], chunk_line, {0: 2, 1: 1}, 2) == 1


def test_a_recipient_not_taken_yet_shows_its_chunks_latest_recorded_version() -> None:
    assert template_use.version_sent([], {0: 2, 1: 1, 2: None}, {}, 2) == 1
    assert template_use.version_sent([], {0: None}, {}, 2) == 2
    assert template_use.version_sent(["c.0"], {0: None}, {}, 2) == 2
