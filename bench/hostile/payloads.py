"""The hostile requests of issue 33, at the sizes it measured them, as plain data (pure).

Request bodies for ``POST /v1/batches``, ``/v1/templates``, ``/v1/lists/{id}/imports`` and
both webhook receivers; :mod:`bench.hostile.attack` sends them to a running stack. The
shapes are those of the parser table (:mod:`bench.hostile.cases`), at full size.
"""

from __future__ import annotations

from typing import Any, Final

from bench.hostile.cases import (
    ENCODED_WORD,
    KEY_PREFIX,
    OPEN_MARKER,
    OPEN_TAG,
    OPEN_WORD,
    mailgun_event_body,
    sendgrid_events_body,
)

SENDER: Final = "hostile@example.com"
#: Item 1: 300 KB of unclosed ``<a`` (62 s in the link rewrite).
CLICK_HTML_TAGS: Final = 100_000
#: Item 3: 10,000 substitution keys (100 recipients x 100) and 300 KB of html: the issue's
#: 800 KB is refused with a 500 before any consumer sees it (the stored batch passes
#: Cassandra's batch_size_fail_threshold, 640 KiB in deploy/local), so this is the most html
#: that 10,000 keys reach the consumers with.
MAILGUN_RECIPIENTS: Final = 100
MAILGUN_HTML_BYTES: Final = 300_000
#: Item 4: 1,000 recipients with 9.9 KB values (a 10 MB request), this many at once.
LARGE_BATCHES: Final = 3
#: Item 5: a 50 MB CSV import, then this many at once (each its own list).
CSV_BYTES: Final = 50 * 1024 * 1024
CSV_AT_ONCE: Final = 4


def click_tracking_batch() -> dict[str, Any]:
    """Item 1: ``"<a " * 100000`` with click tracking (the consumers rewrite the links, the
    tracking endpoint reads them again for a click)."""
    return {
        "from": SENDER,
        "to": ["ann@example.org"],
        "subject": "Hi",
        "html": OPEN_TAG * CLICK_HTML_TAGS,
        "tracking": {"clicks": True},
    }


def template(name: str, html: str) -> dict[str, Any]:
    return {"name": name, "subject": "Hi", "html": html, "sample": {}}


def int_bomb_template() -> dict[str, Any]:
    """Item 2: ``2**49999`` squared 14 times (6.3 s against the 0.5 s limit)."""
    squarings = "".join(f"{{% set v{i + 1} = v{i} * v{i} %}}" for i in range(14))
    return template("int bomb", f"{{% set v0 = 2 ** 49999 %}}{squarings}done")


def memory_bomb_template() -> dict[str, Any]:
    """Item 2: ``{% set aN = "x" * 1000000 %}`` 1,500 times (1.46 GB)."""
    sets = "".join(f'{{% set a{i} = "x" * 1000000 %}}' for i in range(1_500))
    return template("memory bomb", sets + "done")


def compile_bomb_template() -> dict[str, Any]:
    """Item 2: a source just under the 500 KB limit that takes seconds to compile."""
    return template("compile bomb", "{{ [" + "1," * 249_000 + "] }}")


def markers_template() -> dict[str, Any]:
    """168 KB of template markers without their close: each start scanned to the end when
    a batch renders the version (``shared.templates.template_use``; 19 s measured)."""
    return template("markers", OPEN_MARKER * 21_000)


def template_batch(template_id: str) -> dict[str, Any]:
    """A batch sending version 1 of a template (rendered once, its markers checked)."""
    return {"from": SENDER, "to": ["ann@example.org"], "template_id": template_id, "version": 1}


def mailgun_batch() -> dict[str, Any]:
    """Item 3: pinned to Mailgun, 10,000 substitution keys sharing a prefix and html
    repeating it (12.4 s in ``replace_keys`` at 1 MB)."""
    html = (KEY_PREFIX * (MAILGUN_HTML_BYTES // len(KEY_PREFIX) + 1))[:MAILGUN_HTML_BYTES]
    return {
        "from": SENDER,
        "subject": "Hi",
        "html": html,
        "provider": "mailgun",
        "to": [
            {
                "email": f"mg{i}@example.org",
                "substitutions": {f"{KEY_PREFIX[:-1]}{i * 100 + j:05d}-": "v" for j in range(100)},
            }
            for i in range(MAILGUN_RECIPIENTS)
        ],
    }


def large_substitutions_batch(tag: int) -> dict[str, Any]:
    """Item 4: 1,000 recipients with 9.9 KB of encoded words each under a key the subject
    uses: a 10 MB request validated on the API's event loop (2.3-4.4 s)."""
    value = (ENCODED_WORD * 800)[:9_900]
    return {
        "from": SENDER,
        "subject": "Hi -name-",
        "text": "Hello",
        "to": [
            {"email": f"big{tag}-{i}@example.org", "substitutions": {"-name-": value}}
            for i in range(1_000)
        ],
    }


def hostile_addresses_batch() -> dict[str, Any]:
    """Header and address parsing: 1,000 ``to`` entries named by open encoded words, and
    headers and a subject of them."""
    name = OPEN_WORD * 30
    return {
        "from": f'"{name}" <{SENDER}>',
        "reply_to": f'"{name}" <reply@example.com>',
        "subject": OPEN_WORD * 140,
        "text": "Hello",
        "headers": {f"X-Hostile-{i}": OPEN_WORD * 140 for i in range(50)},
        "to": [f'"{name}" <addr{i}@example.org>' for i in range(1_000)],
    }


def csv_file(size: int = CSV_BYTES) -> bytes:
    """Item 5: ``size`` bytes of CSV with 60 fields a row, every row after the first the same
    address: the whole file is read and parsed, and next to nothing is written."""
    fields = ",".join(["v" * 20] * 60)
    header = "email," + ",".join(f"f{i}" for i in range(60))
    row = f"dup@example.org,{fields}"
    return "\n".join([header, *[row] * (size // (len(row) + 1))]).encode()


def sendgrid_webhook() -> bytes:
    """5 MB of SendGrid events (its receiver's cap) with open encoded words everywhere."""
    return sendgrid_events_body(10)


def mailgun_webhook(signature: dict[str, str]) -> bytes:
    """A Mailgun webhook of 230 KB (its receiver reads up to 256 KB): a long delivery message
    and many variables."""
    return mailgun_event_body(10, signature)
