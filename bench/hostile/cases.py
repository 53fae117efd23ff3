"""The parser table of ``make hostile``: every parser that takes a user's or a provider's
input, each with the hostile input that costs it most, built at any scale.

A :class:`Case` builds its input at scale 1 or 10 (untimed) and parses it (timed, in a child
process: :mod:`bench.hostile.measure`). The shapes are those of issue 33 and of the unit
test of linear parsers (``tests/unit/test_parsers_linear.py``): unclosed tags, encoded-word
heads without an end, many substitution keys sharing a prefix, markers without their close,
integers squared, long sources. Each case calls the parser through the function its service
calls, so a rewrite that keeps the function's name and signature is measured as it is; a
parser that refuses an input (raises) is timed all the same: refusing is an answer, taking
minutes is not.

Sizes are in the :data:`CASES` entries' descriptions; the scale multiplies every count.
"""

from __future__ import annotations

import functools
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import orjson
from pydantic import BaseModel

from services.api import contacts_csv, list_import, original_form
from services.api.queries import decode_cursor
from shared.accounts import domains
from shared.core import addresses, webhook_events
from shared.core.models import Chunk, Engagement, Message, Recipient
from shared.delivery import validation
from shared.engagement import engagement, engagement_tokens, link_rewrite, prefetch
from shared.infra.config import TrackingSettings
from shared.providers import mailgun, mailgun_events, sendgrid, sendgrid_events
from shared.templates import template_limits, template_render, template_use


@dataclass(frozen=True, slots=True)
class Case:
    """One parser and its hostile input."""

    name: str
    parser: str
    """Where the parser is (module and function), for the table."""
    hostile: str
    """The input at scale 1, in words."""
    build: Callable[[int], Any]
    """The input at a scale (not timed)."""
    parse: Callable[[Any], object]
    """What is timed."""
    scaled: Callable[[int], int] | None = None
    """Bytes of what the scale grows, when that is not the input's own length (a number
    the input computes)."""

    def size(self, value: Any, scale: int) -> int:
        """Bytes of the input at ``scale``, for the table."""
        return self.scaled(scale) if self.scaled is not None else size_of(value)


# -- inputs -------------------------------------------------------------------------------

#: An ``<a`` that never closes: the tag pattern scanned to the end of the text for each.
OPEN_TAG = "<a "
#: An encoded-word head without its end, and an encoded word (header text decoders).
OPEN_WORD = "=?a?q? "
ENCODED_WORD = "=?utf-8?q?x?= "
#: A template marker without its close.
OPEN_MARKER = "[[sd.h.x"
#: A printf mapping key without its close.
OPEN_KEY = "%("
#: What every substitution key of :func:`mailgun_chunk` starts with: the html repeats it.
KEY_PREFIX = "-name_0"


def message(html: str, *, clicks: bool = False) -> Message:
    return Message.model_validate(
        {
            "from": {"email": "hostile@example.com"},
            "subject": "Hi",
            "html": html,
            "bulk": True,
            "engagement": Engagement(clicks=True) if clicks else None,
        }
    )


def chunk(msg: Message, recipients: list[Recipient]) -> Chunk:
    return Chunk(batch_id=uuid.uuid1(), index=0, message=msg, recipients=tuple(recipients))


def keyed_recipients(count: int, keys_each: int = 100) -> list[Recipient]:
    """``count`` recipients with ``keys_each`` substitution keys of their own each."""
    return [
        Recipient(
            log_id=uuid.uuid4(),
            email=f"r{i}@example.org",
            substitutions={
                f"{KEY_PREFIX[:-1]}{i * keys_each + j:05d}-": "v" for j in range(keys_each)
            },
        )
        for i in range(count)
    ]


def mailgun_chunk(scale: int) -> Chunk:
    """Issue 33 item 3: 1,000 substitution keys (10 recipients x 100) and 80 KB of html made
    of the keys' common prefix, at scale 1."""
    html = (KEY_PREFIX * (80_000 * scale // len(KEY_PREFIX) + 1))[: 80_000 * scale]
    return chunk(message(html), keyed_recipients(10 * scale))


def large_substitutions(scale: int) -> dict[str, Any]:
    """Issue 33 item 4: 100 recipients with 9.9 KB of encoded words each, under a key the
    subject uses (so each value is read as header text), at scale 1 (1 MB)."""
    value = (ENCODED_WORD * 800)[:9_900]
    return {
        "from": "hostile@example.com",
        "subject": "Hi -name-",
        "text": "x",
        "to": [
            {"email": f"r{i}@example.org", "substitutions": {"-name-": value}}
            for i in range(100 * scale)
        ],
    }


def hostile_addresses(scale: int) -> dict[str, Any]:
    """100 ``to`` entries whose display names are 700 characters of open encoded words."""
    name = OPEN_WORD * 100
    return {
        "from": "hostile@example.com",
        "subject": "Hi",
        "text": "x",
        "to": [f'"{name}" <r{i}@example.org>' for i in range(100 * scale)],
    }


def int_bomb(scale: int) -> str:
    """Issue 33 item 2: an integer squared 8 times (no output, so no check of the clock)."""
    squarings = "".join(f"{{% set v{i + 1} = v{i} * v{i} %}}" for i in range(8))
    return f"{{% set v0 = 3 ** {5_000 * scale} %}}{squarings}done"


def memory_bomb(scale: int) -> str:
    """Issue 33 item 2: ``{% set aN = "x" * 1000000 %}``, 150 times at scale 1."""
    return "".join(f'{{% set a{i} = "x" * 1000000 %}}' for i in range(150 * scale)) + "done"


def list_source(scale: int) -> str:
    """A 5 KB list literal at scale 1: slow to compile (issue 33 item 2: 500 KB, 11-18 s)."""
    return "{{ [" + "1," * (2_500 * scale) + "] }}"


def csv_file(scale: int) -> bytes:
    """5 MB of distinct contacts with 60 fields each at scale 1 (issue 33 item 5: 50 MB)."""
    fields = ",".join(["v" * 20] * 60)
    rows = 5 * 1024 * 1024 * scale // (len(fields) + 24)
    header = "email," + ",".join(f"f{i}" for i in range(60))
    return "\n".join([header, *(f"r{i}@example.org,{fields}" for i in range(rows))]).encode()


def csv_import(data: bytes) -> int:
    """Every row read and sorted as the importer does, slice by slice."""
    rows = contacts_csv.scan(data, max_rows=1_000_000)
    done = 0
    while True:
        part = [row for _, row in zip(range(1_000), rows, strict=False)]
        if not part:
            return done
        done += len(
            list_import.sort_slice(
                part, suppressed={}, unsubscribed={}, existing=set(), room=1_000_000
            ).write
        )


def sendgrid_events_body(scale: int) -> bytes:
    """About 500 KB of SendGrid events at scale 1 (its receiver reads up to 5 MB), each
    with hostile text in every field."""
    event = {
        "email": OPEN_WORD * 20 + "@example.org",
        "event": "bounce",
        "reason": OPEN_WORD * 100,
        "sg_event_id": OPEN_WORD * 20,
        "timestamp": OPEN_WORD * 5,
        "batch_id": str(uuid.uuid4()),
        "chunk": "9" * 50,
        "log_id": OPEN_WORD * 10,
    }
    one = orjson.dumps(event)
    return orjson.dumps([event] * (500_000 * scale // (len(one) + 1)))


#: A Mailgun signature block for bodies that are parsed, not verified.
UNSIGNED: Final = {"timestamp": "1", "token": "t" * 50, "signature": "s" * 64}


def mailgun_event_body(scale: int, signature: dict[str, str] = UNSIGNED) -> bytes:
    """One Mailgun webhook of about 24 KB at scale 1 (its receiver reads up to 256 KB): a
    long delivery message and many user variables, open encoded words throughout."""
    return orjson.dumps(
        {
            "signature": signature,
            "event-data": {
                "event": "failed",
                "recipient": OPEN_WORD * 20 + "@example.org",
                "id": OPEN_WORD * 20,
                "timestamp": OPEN_WORD * 10,
                "delivery-status": {"message": OPEN_WORD * (1_500 * scale), "code": 550},
                "user-variables": {f"k{i}": OPEN_WORD for i in range(700 * scale)},
                "message": {"headers": {"message-id": OPEN_WORD * 20}},
            },
        }
    )


def mailgun_event(body: bytes) -> object:
    envelope = mailgun_events.parse_envelope(body)
    return mailgun_events.parse_event(envelope.event_data, received_at=datetime.now(UTC))


def tracker() -> engagement.Tracker:
    return engagement.tracker_of(TrackingSettings())


def _repeat(unit: str, count: int) -> Callable[[int], str]:
    return lambda scale: unit * (count * scale)


def _text_cases() -> list[Case]:
    """The text parsers of headers, addresses and provider events, over a 100 KB run of an
    open encoded word (those of ``tests/unit/test_parsers_linear.py`` read it at 1 MB)."""
    parsers: dict[str, tuple[str, Callable[[str], object]]] = {
        "address list": ("shared.core.addresses.split_address_list", addresses.split_address_list),
        "address": ("shared.core.addresses.parse_address", addresses.parse_address),
        "header text": ("shared.core.addresses.text_problem", addresses.text_problem),
        "display name": ("shared.core.addresses.display_name", addresses.display_name),
        "webhook email": ("shared.core.webhook_events.parse_email", webhook_events.parse_email),
        "webhook time": ("shared.core.webhook_events.parse_time", webhook_events.parse_time),
        "original is_email": ("services.api.original_form.is_email", original_form.is_email),
    }
    count = 100_000 // len(OPEN_WORD)
    return [
        Case(name, where, f'"{OPEN_WORD}" x {count:,} (100 KB)', _repeat(OPEN_WORD, count), parse)
        for name, (where, parse) in parsers.items()
    ]


def _json_array(item: bytes, size: int) -> bytes:
    return b"[" + b",".join([item] * (size // (len(item) + 1))) + b"]"


#: Shapes of a SendGrid delivery that attack its size rather than its text, each built at
#: a given size in bytes (they were timed in a unit test; a time is this harness's to judge).
SENDGRID_SHAPES: Final[dict[str, Callable[[int], bytes]]] = {
    "empty objects": lambda n: _json_array(b"{}", n),
    "address-less events": lambda n: _json_array(b'{"event":"bounce","email":null,"type":"x"}', n),
    "one huge address": lambda n: b'[{"email":"' + b"a" * n + b'@x.com"}]',
    "one huge reason": lambda n: (
        b'[{"email":"a@x.com","event":"dropped","reason":"' + b"r" * n + b'"}]'
    ),
    "escaped text": lambda n: b'[{"email":"a@x.com","reason":"' + b"\\u00e9" * (n // 6) + b'"}]',
    "a key repeated": lambda n: b"[{" + b",".join([b'"email":"a@x.com"'] * (n // 18)) + b"}]",
    "many keys": lambda n: (
        b'[{"email":"a@x.com",' + b",".join(b'"k%d":1' % i for i in range(n // 10)) + b"}]"
    ),
    "deep nesting": lambda n: b"[" * n,
    "whitespace": lambda n: b" " * n,
    "a long number": lambda n: b"[" + b"1" * n + b"]",
}


def mailgun_fields_body(scale: int) -> bytes:
    """A Mailgun envelope whose id-less event-data is 10 KB of fields at scale 1, the same
    fields as its user variables (20 KB; 200 KB at 10x, under the receiver's 256 KB)."""
    fields = {f"k{i}": [i, str(i)] for i in range(10_000 * scale // 22)}
    return orjson.dumps(
        {
            "signature": {"timestamp": "1", "token": "t", "signature": "s"},
            "event-data": {"recipient": "a@x.com", "user-variables": fields, **fields},
        }
    )


def _at_100kb(make: Callable[[int], bytes], scale: int) -> bytes:
    return make(100_000 * scale)


def _webhook_shape_cases() -> list[Case]:
    """Each SendGrid shape at 100 KB (1 MB at 10x; its receiver reads up to 5 MB), and
    Mailgun's many fields."""
    where = "shared.providers.sendgrid_events.parse_events"
    found = [
        Case(
            f"SendGrid webhook: {name}",
            where,
            f"{name} (100 KB)",
            functools.partial(_at_100kb, make),
            sendgrid_events.parse_events,
        )
        for name, make in SENDGRID_SHAPES.items()
    ]
    found.append(
        Case(
            "Mailgun webhook: many fields",
            "shared.providers.mailgun_events.parse_envelope + parse_event",
            "10 KB of event-data fields and as many user variables, no ids",
            mailgun_fields_body,
            mailgun_event,
        )
    )
    return found


CASES: tuple[Case, ...] = (
    Case(
        "link rewrite",
        "shared.engagement.link_rewrite.rewrite",
        '"<a " x 10,000 (30 KB; issue 33 item 1)',
        _repeat(OPEN_TAG, 10_000),
        lambda html: link_rewrite.rewrite(html, str),
    ),
    Case(
        "tracked links of a stored message",
        "shared.engagement.engagement.links_of (tracking endpoint)",
        '"<a " x 10,000 (30 KB), clicks tracked',
        lambda scale: message(OPEN_TAG * 10_000 * scale, clicks=True),
        engagement.links_of,
    ),
    Case(
        "personalize (click tracking)",
        "shared.engagement.engagement.personalize (consumers)",
        '"<a " x 10,000 (30 KB), clicks tracked, 1 recipient',
        lambda scale: (
            chunk(
                message(OPEN_TAG * 10_000 * scale, clicks=True),
                [Recipient(log_id=uuid.uuid4(), email="r@example.org")],
            ),
            tracker(),
        ),
        lambda args: engagement.personalize(*args),
    ),
    Case(
        "Mailgun substitutions",
        "shared.providers.mailgun.build_form (replace_keys)",
        "1,000 keys sharing a prefix, 80 KB of html repeating it (issue 33 item 3)",
        mailgun_chunk,
        mailgun.build_form,
    ),
    Case(
        "SendGrid payload",
        "shared.providers.sendgrid.encoded_payload",
        "the same chunk as Mailgun substitutions",
        mailgun_chunk,
        sendgrid.encoded_payload,
    ),
    Case(
        "batch validation: substitutions",
        "shared.delivery.validation.parse_batch_request",
        "100 recipients x 9.9 KB of encoded words under a subject key (1 MB; item 4)",
        large_substitutions,
        lambda body: validation.parse_batch_request(body, max_recipients=1_000),
    ),
    Case(
        "batch validation: display names",
        "shared.delivery.validation.parse_batch_request",
        '100 "to" entries, each named by 700 characters of open encoded words',
        hostile_addresses,
        lambda body: validation.parse_batch_request(body, max_recipients=1_000),
    ),
    *_text_cases(),
    *_webhook_shape_cases(),
    Case(
        "template compile",
        "shared.templates.template_render.compile_part",
        "a 5 KB list literal (item 2: 500 KB took 11-18 s)",
        list_source,
        lambda source: template_render.compile_part(source, html_part=True),
    ),
    Case(
        "template render: integers",
        "shared.templates.template_render.render_part",
        "3 ** 5000 squared 8 times (item 2; size: the integer squared first)",
        int_bomb,
        lambda source: template_render.render_part(source, {}, html_part=True),
        scaled=lambda scale: math.ceil(5_000 * scale * math.log2(3) / 8),
    ),
    Case(
        "template render: memory",
        "shared.templates.template_render.render_part",
        '{% set aN = "x" * 1000000 %} x 150 (item 2: 1,500 used 1.46 GB)',
        memory_bomb,
        lambda source: template_render.render_part(source, {}, html_part=True),
    ),
    Case(
        "template text from html",
        "shared.templates.template_render.text_of",
        '"<a " x 100,000 (300 KB)',
        _repeat(OPEN_TAG, 100_000),
        template_render.text_of,
    ),
    Case(
        "template text from html: a tag of blanks",
        "shared.templates.template_render.text_of (_TAG_NAME)",
        "one tag of 5,000 blanks with a slash in their middle (5 KB)",
        lambda scale: "x<" + " " * 2_500 * scale + "/" + " " * 2_500 * scale + ">y",
        template_render.text_of,
    ),
    Case(
        "template % format",
        "shared.templates.template_limits.check_percent_format (% and the format filter)",
        '"%(" x 5,000 (10 KB): mapping keys no ")" closes',
        _repeat(OPEN_KEY, 5_000),
        lambda fmt: template_limits.check_percent_format(fmt, ()),
    ),
    Case(
        "template markers",
        "shared.templates.template_use.render_once (_check_markers)",
        f'"{OPEN_MARKER}" x 1,250 (10 KB) in a template\'s html',
        lambda scale: template_use.Source(1, "Hi", OPEN_MARKER * 1_250 * scale, None),
        lambda source: template_use.render_once(source, {}, ()),
    ),
    Case(
        "CSV contact import",
        "services.api.contacts_csv.scan + services.api.list_import.sort_slice",
        "5 MB: distinct contacts with 60 fields each (item 5: 50 MB)",
        csv_file,
        csv_import,
    ),
    Case(
        "SendGrid webhook",
        "shared.providers.sendgrid_events.parse_events",
        "500 KB of events with open encoded words in every field (5 MB at 10x: the cap)",
        sendgrid_events_body,
        sendgrid_events.parse_events,
    ),
    Case(
        "Mailgun webhook",
        "shared.providers.mailgun_events.parse_envelope + parse_event",
        "24 KB: a 10 KB delivery message, 700 user variables (230 KB at 10x: the cap)",
        mailgun_event_body,
        mailgun_event,
    ),
    Case(
        "tracking token",
        "shared.engagement.engagement_tokens.read (tracking endpoint)",
        'a token of "a." x 5,000 (10 KB)',
        _repeat("a.", 5_000),
        lambda token: engagement_tokens.read(token, tracker().ring),
    ),
    Case(
        "tracking user agent",
        "shared.engagement.prefetch.machine (tracking endpoint)",
        "a 10 KB user agent",
        _repeat("Mozilla/5.0 ", 850),
        prefetch.machine,
    ),
    Case(
        "page cursor",
        "services.api.queries.decode_cursor",
        "a 100 KB cursor",
        _repeat("eyJh", 25_000),
        decode_cursor,
    ),
    Case(
        "DNS TXT answer",
        "shared.accounts.domains.txt_strings (domain verification)",
        "a TXT record of 6.5 KB: an open quote and escaped quotes (65 KB at 10x: a DNS message)",
        lambda scale: {"Answer": [{"type": 16, "data": '"' + '\\"' * 3_250 * scale}]},
        domains.txt_strings,
    ),
)


def by_name(name: str) -> Case:
    """The case called ``name``; KeyError if none is."""
    for case in CASES:
        if case.name == name:
            return case
    raise KeyError(name)


def size_of(value: Any) -> int:
    """Bytes of an input, for the table (its JSON for structured ones)."""
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, BaseModel):
        return len(value.model_dump_json())
    if isinstance(value, template_use.Source):
        return sum(len((part or "").encode()) for part in (value.subject, value.html, value.text))
    if isinstance(value, tuple):
        return sum(size_of(v) for v in value)
    try:
        return len(orjson.dumps(value))
    except TypeError:
        return len(repr(value))
