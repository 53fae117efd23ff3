"""CPU per recipient of the SendGrid Mail Send body, the helpers' way and ours, in one run.

``python -m bench.payloads`` (by hand; not a test, not part of ``make bench``) builds the body
of a 100- and a 1,000-recipient chunk as the consumer does (:func:`encoded_payload`: validation,
the body, orjson) and as the ``sendgrid`` helpers did (``tests.unit.providers
.sendgrid_reference``, then orjson), and prints the process CPU time per recipient of each.
The chunks are bulk (one personalization per recipient, as the dispatcher sends), with names,
substitutions and a List-Unsubscribe header per recipient, a reply-to, headers and
categories; ``--shared`` measures one shared personalization instead.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable

import orjson

from shared.core.models import Address, Chunk, Engagement, Message, Recipient
from shared.providers.sendgrid import encoded_payload
from tests.unit.providers.sendgrid_reference import reference_payload

#: Seconds of CPU each figure is measured over (at least).
SECONDS = 1.0


def chunk(count: int, *, bulk: bool = True) -> Chunk:
    """A chunk of ``count`` recipients using what a campaign's chunk usually carries."""
    batch = uuid.uuid1()
    recipients = tuple(
        Recipient(
            log_id=uuid.uuid4(),
            email=f"recipient.{n}@example.org",
            name=f"Recipient Nº {n}",
            substitutions={"-first-": f"First{n}", "-code-": f"C{n:06d}"},
            headers={
                "List-Unsubscribe": f"<https://t.example.com/u/{n}.abcdef>",
                "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
            }
            if bulk
            else {},
        )
        for n in range(count)
    )
    message = Message(
        sender=Address(email="news@example.com", name="Example News"),
        subject="Hello -first-, your code is -code-",
        text="Hello -first-,\n\nyour code is -code-.\n" * 20,
        html="<p>Hello -first-,</p><p>your code is <b>-code-</b>.</p>" * 20,
        reply_to=Address(email="help@example.com", name="Help"),
        headers={"X-Campaign": "spring-sale"},
        categories=("newsletter", "spring"),
        bulk=bulk,
        engagement=Engagement(opens=True, clicks=True, unsubscribe=True),
    )
    return Chunk(batch_id=batch, index=0, message=message, recipients=recipients, attempt="c.1")


def per_recipient_us(build: Callable[[Chunk], bytes], subject: Chunk) -> float:
    """Process CPU µs per recipient of ``build(subject)``, over at least :data:`SECONDS`."""
    build(subject)  # warm up: imports, caches
    runs = 0
    started = time.process_time()
    while (spent := time.process_time() - started) < SECONDS:
        build(subject)
        runs += 1
    return spent / runs / len(subject.recipients) * 1e6


def reference(subject: Chunk) -> bytes:
    return orjson.dumps(reference_payload(subject))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", action="store_true", help="one shared personalization")
    args = parser.parse_args()
    kind = "shared" if args.shared else "bulk"
    print(f"SendGrid body, {kind}: process CPU µs per recipient (min {SECONDS:.0f} s each)")
    for count in (100, 1000):
        subject = chunk(count, bulk=not args.shared)
        if orjson.loads(reference(subject)) != orjson.loads(encoded_payload(subject)):
            raise SystemExit(f"N={count}: the two bodies differ; run the conformance test")
        old = per_recipient_us(reference, subject)
        new = per_recipient_us(encoded_payload, subject)
        print(f"N={count:>5}  helpers {old:8.2f}  direct {new:8.2f}  ({old / new:.1f}x)")


if __name__ == "__main__":
    main()
