"""Provider-neutral rules for what one chunk puts on the wire.

Every adapter applies these before building its own payload, so a chunk that fails over from
one provider to another produces the same email:

* **Validation** (:func:`check_chunk`): a chunk no provider should receive raises
  ``PermanentProviderError`` before any network call: no recipients, too many recipients,
  cc/bcc together with ``bulk``, a header we may not set, or CR/LF/NUL in anything that ends
  up in a header (the API rejects these first; this is the last line of defence).
* **Copies** (:func:`copies`): cc and bcc receive *one* copy per batch. They ride on chunk 0
  only, because every chunk is a separate provider request and putting them on each would
  send a copy per chunk. With ``bulk`` (one message per recipient) they would get one copy
  per recipient -- up to 1,000 per chunk -- so that combination is refused instead.
  Addresses already among the chunk's recipients are dropped from cc/bcc (SendGrid refuses a
  request that names an address twice).
* **Substitutions** follow SendGrid's semantics everywhere: each key is replaced literally in
  the subject, text and html. A shared (non-bulk) message can only carry the substitutions
  every recipient of the chunk agrees on (:func:`shared_substitutions`); a single-recipient
  chunk therefore keeps all of its own. :func:`replace_keys` lets providers without literal
  substitution (Mailgun) produce the same result.
* **Metadata** is not sent to providers: it stays with the batch in our store, our webhooks
  correlate events by ``batch_id``/``log_id``, and leaving it out keeps SendGrid's 10 kB
  ``custom_args`` and Mailgun's 16 kB option budgets for our correlation ids.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from shared.core.addresses import address_key
from shared.core.errors import PermanentProviderError
from shared.core.models import Address, Chunk, Recipient, is_reserved_header
from shared.core.substitution import Substitution

# A header name is printable ASCII without ':' (RFC 5322 section 2.2).
_HEADER_NAME = re.compile(r"^[!-9;-~]+$")
_UNSAFE = re.compile(r"[\r\n\0]")


def check_chunk(provider: str, chunk: Chunk, max_recipients: int) -> None:
    """Raise ``PermanentProviderError`` if no provider should be sent this chunk."""
    problem = _recipients_problem(chunk, max_recipients) or _headers_problem(chunk)
    if problem:
        raise PermanentProviderError(provider, problem)


def copies(chunk: Chunk) -> tuple[tuple[Address, ...], tuple[Address, ...]]:
    """The cc and bcc addresses this chunk carries (see the module docstring)."""
    message = chunk.message
    if chunk.index != 0 or message.bulk:
        return (), ()
    seen = {address_key(r.email) for r in chunk.recipients}
    cc = _unseen(message.cc, seen)
    bcc = _unseen(message.bcc, seen)
    return cc, bcc


def shared_substitutions(recipients: Sequence[Recipient]) -> dict[str, str]:
    """The substitutions (key and value) that every recipient has in common."""
    if not recipients:
        return {}
    common = dict(recipients[0].substitutions)
    for recipient in recipients[1:]:
        common = {k: v for k, v in common.items() if recipient.substitutions.get(k) == v}
    return common


def replace_keys(text: str, replacements: Mapping[str, str]) -> str:
    """Replace each key literally, in one pass, preferring the longest key at a position
    (``shared.core.substitution``; prepare a :class:`Substitution` to replace in several texts)."""
    if not text or not replacements:
        return text
    return Substitution(replacements).apply(text)


def _unseen(addresses: Iterable[Address], seen: set[str]) -> tuple[Address, ...]:
    kept = []
    for address in addresses:
        key = address_key(address.email)
        if key not in seen:
            seen.add(key)
            kept.append(address)
    return tuple(kept)


def _recipients_problem(chunk: Chunk, max_recipients: int) -> str | None:
    message = chunk.message
    if not chunk.recipients:
        return "the chunk has no recipients"
    if message.bulk and (message.cc or message.bcc):
        return "cc/bcc cannot be combined with bulk: every recipient's copy would be copied"
    cc, bcc = copies(chunk)
    total = len(chunk.recipients) + len(cc) + len(bcc)
    if total > max_recipients:
        return f"{total} recipients (to+cc+bcc) exceed the limit of {max_recipients} per request"
    return None


def _headers_problem(chunk: Chunk) -> str | None:
    message = chunk.message
    for name, value in message.headers.items():
        if is_reserved_header(name):
            return f"header {name!r} may not be set"
        if not _HEADER_NAME.match(name) or _UNSAFE.search(value):
            return f"header {name!r} has an invalid name or value"
    names = [message.sender.name, message.reply_to.name if message.reply_to else None]
    names += [a.name for a in (*message.cc, *message.bcc)]
    names += [r.name for r in chunk.recipients]
    addresses = [message.sender.email, *(a.email for a in (*message.cc, *message.bcc))]
    addresses += [r.email for r in chunk.recipients]
    if message.reply_to:
        addresses.append(message.reply_to.email)
    fields = [message.subject, *message.categories, *addresses, *(n for n in names if n)]
    # One search over them all (the separator is safe, so a match is in one of them): two
    # searches per recipient cost more than the rest of the check.
    if _UNSAFE.search(" ".join(fields)):
        return "a subject, name, address or category contains CR, LF or NUL"
    return None
