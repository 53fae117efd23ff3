"""Our SendGrid payload is the one the official ``sendgrid`` helpers build, field by field."""

from __future__ import annotations

import uuid
from types import ModuleType
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shared.core.errors import PermanentProviderError
from shared.core.models import Address, Attachment, Chunk, Engagement, Message, Recipient
from shared.providers import sendgrid
from shared.providers.sendgrid import encoded_payload
from tests.unit.providers.fakes import BATCH_ID
from tests.unit.providers.sendgrid_reference import reference_payload

# Text as senders write it: unicode, quotes, commas, angle brackets, backslashes.
_TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from(list("\"',;<>\\ éßü名字🙂-{}%")),
        st.characters(codec="utf-8", categories=("L", "N", "P", "Zs")),
    ),
    max_size=12,
)
_EMAILS = st.sampled_from(
    ["ann@example.org", "Ann@Example.org", "bob@example.org", "zoë@exämple.de", "c@x.io"]
)
_NAMES = st.one_of(st.none(), st.just(""), _TEXT)
_ADDRESSES = st.builds(Address, email=_EMAILS, name=_NAMES)
_KEYS = st.sampled_from(["-first-", "-last-", "{{name}}", "%code%"])
# Now and then a header we may not set or CR/LF/NUL where it would reach a header: both
# builders must refuse the chunk.
_HEADER_NAMES = st.sampled_from(
    ["X-Campaign", "List-Id", "X-Entity-Ref-ID", "X-A", "X-B", "X-C", "X-D", "To", "B c"]
)
_RECIPIENT_HEADERS = st.dictionaries(
    st.sampled_from(["List-Unsubscribe", "List-Unsubscribe-Post", "X-Track"]), _TEXT, max_size=3
)
_CONTENT = st.one_of(st.none(), st.just(""), _TEXT)
_ATTACHMENTS = st.lists(
    st.one_of(
        st.builds(
            Attachment,
            filename=st.sampled_from(["a.txt", "Zoë's report, final.pdf", "名字.csv"]),
            content_type=st.sampled_from(["text/plain", "application/pdf"]),
            content=st.sampled_from(["aGVsbG8=", "JVBERi0xLjQK", "QQ=="]),
        ),
        st.builds(
            Attachment,
            filename=st.just("logo.png"),
            content_type=st.just("image/png"),
            content=st.just("iVBORw=="),
            disposition=st.just("inline"),
            content_id=st.sampled_from(["logo", "logo@example.com"]),
        ),
    ),
    max_size=3,
).map(tuple)


@st.composite
def _recipients(draw: st.DrawFn) -> tuple[Recipient, ...]:
    count = draw(st.integers(1, 6))
    return tuple(
        Recipient(
            log_id=uuid.UUID(int=draw(st.integers(0, 2**128 - 1))),
            email=draw(_EMAILS),
            name=draw(_NAMES),
            substitutions=draw(st.dictionaries(_KEYS, _TEXT, max_size=3)),
            headers=draw(_RECIPIENT_HEADERS),
        )
        for _ in range(count)
    )


@st.composite
def _chunks(draw: st.DrawFn) -> Chunk:
    bulk = draw(st.booleans())
    # cc/bcc with bulk is refused by both (tested below); drawn rarely so most chunks are sent.
    copies = st.lists(_ADDRESSES, max_size=0 if bulk and draw(st.integers(0, 9)) else 3)
    # Now and then a subject with CR/LF/NUL or content starting with a SendGrid API key.
    subject = draw(_TEXT) + ("" if draw(st.integers(0, 7)) else draw(st.sampled_from("\r\n\0")))
    html = draw(_CONTENT)
    if not draw(st.integers(0, 7)):
        html = "SG.abc123.XYZ789" + (html or "")
    message = Message(
        sender=draw(_ADDRESSES),
        subject=subject,
        html=html,
        text=draw(_CONTENT),
        reply_to=draw(st.one_of(st.none(), _ADDRESSES)),
        cc=tuple(draw(copies)),
        bcc=tuple(draw(copies)),
        headers=draw(st.dictionaries(_HEADER_NAMES, _TEXT, max_size=2)),
        categories=tuple(draw(st.lists(_TEXT, max_size=12))),
        metadata=draw(st.dictionaries(_KEYS, _TEXT, max_size=2)),
        bulk=bulk,
        engagement=draw(
            st.one_of(st.none(), st.builds(Engagement, opens=st.booleans(), clicks=st.booleans()))
        ),
        attachments=draw(_ATTACHMENTS),
    )
    return Chunk(
        batch_id=BATCH_ID,
        index=draw(st.integers(0, 3)),
        message=message,
        recipients=draw(_recipients()),
        attempt=draw(st.sampled_from(["", "c.1", "r.12"])),
    )


def _both(chunk: Chunk) -> tuple[Any, Any]:
    """Each builder's decoded JSON body, or the error it raised."""
    try:
        ours: Any = orjson.loads(encoded_payload(chunk))
    except PermanentProviderError as exc:
        ours = ("refused", exc.provider)
    try:
        theirs: Any = orjson.loads(orjson.dumps(reference_payload(chunk)))
    except PermanentProviderError as exc:
        theirs = ("refused", exc.provider)
    return ours, theirs


def _assert_same(ours: Any, theirs: Any) -> None:
    if isinstance(theirs, tuple) or isinstance(ours, tuple):
        assert ours == theirs
        return
    assert sorted(ours) == sorted(theirs)
    for field in theirs:
        if field == "personalizations":
            assert len(ours[field]) == len(theirs[field])
            pairs = zip(ours[field], theirs[field], strict=True)
            for index, (mine, reference) in enumerate(pairs):
                for part in mine.keys() | reference.keys():
                    assert mine.get(part) == reference.get(part), (index, part)
        else:
            assert ours[field] == theirs[field], field


def _full(bulk: bool, count: int) -> Chunk:
    people = tuple(
        Recipient(
            log_id=uuid.UUID(int=n),
            email=f"r{n}@example.org",
            name=f'Zoë "{n}", Jr.' if n % 2 else None,
            substitutions={"-first-": f"R{n}", "-team-": "blue"},
            headers={"List-Unsubscribe": f"<https://u.example/{n}>"} if bulk else {},
        )
        for n in range(count)
    )
    message = Message(
        sender=Address(email="news@example.com", name='Café, "Ünïcode"'),
        subject="Hi -first-",
        text="Hello -first-",
        html="<p>Hello -first-</p>",
        reply_to=Address(email="help@example.com", name="Help"),
        cc=() if bulk else (Address(email="boss@example.com", name="Boss"),),
        bcc=() if bulk else (Address(email="audit@example.com"),),
        headers={"X-Campaign": "spring"},
        categories=tuple(f"cat-{n}" for n in range(12)),
        bulk=bulk,
        attachments=(
            Attachment(filename="a.pdf", content_type="application/pdf", content="JVBERi0xLjQK"),
            Attachment(
                filename="logo.png",
                content_type="image/png",
                content="iVBORw==",
                disposition="inline",
                content_id="logo",
            ),
        ),
    )
    return Chunk(batch_id=BATCH_ID, index=0, message=message, recipients=people, attempt="c.1")


@settings(max_examples=200, deadline=None)
@given(_chunks())
@example(_full(bulk=True, count=3))
@example(_full(bulk=False, count=3))
def test_generated_chunks_match_the_helpers(chunk: Chunk) -> None:
    """For any chunk, our body decodes to the helpers' body field by field, or both refuse it."""
    ours, theirs = _both(chunk)

    _assert_same(ours, theirs)


@pytest.mark.parametrize("bulk", [True, False])
def test_a_full_chunk_of_1000_matches_the_helpers(bulk: bool) -> None:
    """A 1,000-recipient chunk using every feature is the helpers' body, bulk or shared."""
    # Shared, the cc and bcc count against the 1,000.
    ours, theirs = _both(_full(bulk, 1000 if bulk else 998))

    assert not isinstance(theirs, tuple)
    _assert_same(ours, theirs)


def test_attachments_are_the_helpers_attachments() -> None:
    """A chunk's files are the body's ``attachments``, as the helpers write them."""
    ours, theirs = _both(_full(bulk=False, count=2))

    assert (
        ours["attachments"]
        == theirs["attachments"]
        == [
            {
                "content": "JVBERi0xLjQK",
                "filename": "a.pdf",
                "type": "application/pdf",
                "disposition": "attachment",
            },
            {
                "content": "iVBORw==",
                "filename": "logo.png",
                "type": "image/png",
                "disposition": "inline",
                "content_id": "logo",
            },
        ]
    )


def test_the_adapter_does_not_use_the_helpers() -> None:
    """The SendGrid adapter holds nothing from the sendgrid package: the helpers stay here."""
    used = {getattr(value, "__module__", None) or "" for value in vars(sendgrid).values()}
    used |= {value.__name__ for value in vars(sendgrid).values() if isinstance(value, ModuleType)}

    assert sorted(name for name in used if name.split(".")[0] == "sendgrid") == []
