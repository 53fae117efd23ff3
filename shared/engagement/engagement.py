"""Each recipient's copy of a tracked or unsubscribable message, as it goes to the provider.

A batch's message is stored once; what differs per recipient is a signed token
(``shared.engagement.engagement_tokens``) in each tracked link, in the open pixel and in the
List-Unsubscribe header. Tokens travel the way every per-recipient value already does:

* each tracked link's href (``shared.engagement.link_rewrite``) becomes the key ``{sd:cN}``, whose
  value in the recipient's own substitutions is ``<base>/c/<token>``; the pixel is
  ``<base>/o/{sd:o}`` (SendGrid replaces keys literally; Mailgun through recipient
  variables);
* ``List-Unsubscribe`` (RFC 2369: the HTTPS URL, and a ``mailto:`` when one is configured)
  is a header of the recipient's copy only (SendGrid personalization headers, Mailgun
  ``h:`` headers with a recipient variable); ``List-Unsubscribe-Post:
  List-Unsubscribe=One-Click`` (RFC 8058) is the same for all.

Only copies made per recipient can carry them: a shared message (one copy seen by every
recipient of a chunk) is sent as it is. The unsubscribe headers are ours alone: requests may
not set them (``shared.core.models.UNSUBSCRIBE_HEADERS``), and a message stored before that rule
loses its sender's when it gets ours, so a recipient's unsubscribe always reaches the
suppression list. A link holding a substitution key (it differs per recipient) is tracked
only when its host is one the operator allows (``SAFEDELIVR_TRACKING_REDIRECT_HOSTS``): its
token then carries the recipient's own URL. Links are tracked up to
:data:`MAX_TRACKED_LINKS` per message (each costs a token per recipient, and SendGrid caps a
recipient's substitutions at 10 kB); the rest stay as they are. The links a click may go to
are :func:`links_of` the stored message: the same pure rewrite, so the redirect never
depends on anything a URL can carry.

Pure.
"""

from __future__ import annotations

import functools
import html
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from shared.core.keyring import KeyRing, ring_from
from shared.core.models import UNSUBSCRIBE_HEADERS, Chunk, Engagement, Message, Recipient
from shared.core.substitution import Substitution
from shared.engagement.engagement_tokens import Claim, host_of, sign
from shared.engagement.link_rewrite import rewrite
from shared.infra.config import TrackingSettings

#: Links of one message that are tracked (later ones are left as they are).
MAX_TRACKED_LINKS: Final = 60
#: Longest personal link tracked (its token carries the recipient's URL), before and after
#: the recipient's substitutions.
MAX_PERSONAL_LINK: Final = 512
MAX_PERSONAL_URL: Final = 1024
#: What tokens may bring a recipient's substitutions up to (SendGrid caps them at 10,000
#: bytes; the rest is margin for its own counting).
SUBSTITUTION_BUDGET: Final = 9_500
#: The most a click or open token without a URL weighs: a key id of up to 16 characters, the
#: packed claim (44 bytes, base64) and the MAC, with their dots.
TOKEN_BYTES: Final = 16 + (4 * 44 + 2) // 3 + 22 + 2
#: Substitution key of the open pixel's token.
OPEN_KEY: Final = "{sd:o}"
ONE_CLICK: Final = "List-Unsubscribe=One-Click"


def click_key(index: int) -> str:
    """Substitution key of the token of the message's ``index``-th tracked link."""
    return f"{{sd:c{index}}}"


@dataclass(frozen=True, slots=True)
class Tracker:
    """Where the tracking endpoint is and how its tokens are signed (from settings)."""

    base_url: str
    """The tracking endpoint's public URL, e.g. ``https://t.example.com`` (no trailing /)."""
    ring: KeyRing
    mailto: str | None = None
    """The address of the ``mailto:`` unsubscribe (None: the HTTPS URL only)."""
    allowed_hosts: frozenset[str] = frozenset()
    """Hosts whose personal links (holding a substitution key) are tracked too: their
    tokens carry each recipient's own URL (``engagement_tokens.redirect_target``)."""

    def personal_link(self, link: str) -> bool:
        """Whether a link holding a substitution key is tracked (its host is allowed)."""
        return len(link) <= MAX_PERSONAL_LINK and host_of(link) in self.allowed_hosts

    def url(self, kind: str, token: str) -> str:
        return f"{self.base_url}/{kind}/{token}"


def tracker_of(settings: TrackingSettings) -> Tracker:
    """The tracker the settings describe."""
    return Tracker(
        base_url=settings.public_url,
        ring=ring_from(settings.keys.get_secret_value()),
        mailto=settings.unsubscribe_mailto,
        allowed_hosts=settings.allowed_hosts,
    )


def personal(message: Message) -> bool:
    """Whether each recipient gets their own copy (only then can it carry their tokens)."""
    return message.bulk


def links_of(message: Message) -> list[str]:
    """The links of ``message`` that clicks go to, in the order their tokens number them
    (the numbering depends on the message alone: ``shared.engagement.link_rewrite``)."""
    engagement = message.engagement
    if engagement is None or not engagement.clicks or not message.html:
        return []
    return rewrite(message.html, str, limit=MAX_TRACKED_LINKS)[1]


class _OwnKeys:
    """Each recipient's own substitutions, prepared on the first personal link for all of
    them (a link is replaced in once per recipient)."""

    def __init__(self, recipients: Sequence[Recipient]) -> None:
        self._recipients = recipients

    @functools.cached_property
    def each(self) -> list[Substitution]:
        return [Substitution(r.substitutions) for r in self._recipients]


def personalize(chunk: Chunk, tracker: Tracker | None) -> Chunk:
    """The chunk as it goes to the provider: each recipient's tokens added (unchanged when
    the batch asks for nothing, or its copies are shared, or tracking is not configured)."""
    message = chunk.message
    engagement = message.engagement
    if engagement is None or not engagement.any or tracker is None or not personal(message):
        return chunk
    body = message.html
    tracked: dict[int, str | None] = {}
    own = _OwnKeys(chunk.recipients)
    # What the recipients' own substitutions already take of SendGrid's 10 kB: tokens are
    # added while they fit (a link that does not stays as it is; so does the pixel).
    spent = max((_substitutions_bytes(r.substitutions) for r in chunk.recipients), default=0)
    opens = bool(engagement.opens and body) and (
        spent + _token_bytes(tracker) <= SUBSTITUTION_BUDGET
    )
    spent += _token_bytes(tracker) if opens else 0
    if engagement.clicks and body:
        # Links holding a substitution key differ per recipient: they stay as they are
        # (they get an index, but no token is ever made for it), unless the operator allows
        # their host: then each recipient's token carries their own URL.
        keys = Substitution({k: "" for r in chunk.recipients for k in r.substitutions})
        decided: list[str | bool | None] = []  # per link index: False, or what its token holds

        def rewritable(link: str) -> bool:
            nonlocal spent
            personal = keys.found_in(link)  # rewrite asks only of absolute http(s) links
            if personal and not tracker.personal_link(link):
                decided.append(False)
                return False
            url = max(len(k.apply(link)) for k in own.each) if personal else 0
            cost = _token_bytes(tracker, url) + len(click_key(len(decided)))
            if spent + cost > SUBSTITUTION_BUDGET:
                decided.append(False)
                return False
            spent += cost
            decided.append(link if personal else None)
            return True

        body, _ = rewrite(body, click_key, limit=MAX_TRACKED_LINKS, rewritable=rewritable)
        tracked = {i: d for i, d in enumerate(decided) if d is not False}  # type: ignore[misc]
    if opens and body:
        body = _with_pixel(body, tracker.url("o", OPEN_KEY))
    headers = dict(message.headers)
    unsubscribe = engagement.unsubscribe
    if unsubscribe:
        headers = {k: v for k, v in headers.items() if k.lower() not in UNSUBSCRIBE_HEADERS}
        headers["List-Unsubscribe-Post"] = ONE_CLICK
    personal_links = any(tracked.values())
    recipients = tuple(
        _recipient(
            r,
            chunk,
            engagement,
            tracker,
            tracked,
            own.each[index] if personal_links else None,
            opens=opens,
            unsubscribe=unsubscribe,
        )
        for index, r in enumerate(chunk.recipients)
    )
    changed = message.model_copy(update={"html": body, "headers": headers})
    return chunk.model_copy(update={"message": changed, "recipients": recipients})


def _substitutions_bytes(substitutions: Mapping[str, str]) -> int:
    """What a recipient's substitutions weigh against SendGrid's limit (keys and values)."""
    return sum(len(k.encode()) + len(v.encode()) + 6 for k, v in substitutions.items())


def _token_bytes(tracker: Tracker, url: int = 0) -> int:
    """The most one token's substitution can weigh (its URL, for a personal link, inside)."""
    return len(tracker.url("c", "")) + 8 + TOKEN_BYTES + (4 * min(url, MAX_PERSONAL_URL)) // 3


def _recipient(
    recipient: Recipient,
    chunk: Chunk,
    engagement: Engagement,
    tracker: Tracker,
    tracked: Mapping[int, str | None],
    keys: Substitution | None,
    *,
    opens: bool,
    unsubscribe: bool,
) -> Recipient:
    """The recipient with their tokens; ``keys`` are their own substitutions, prepared
    (None when no personal link is tracked)."""

    def token(
        purpose: str, link: int | None = None, scope: str | None = None, url: str | None = None
    ) -> str:
        claim = Claim(
            purpose,  # type: ignore[arg-type]  # one of the three, by the calls below
            chunk.batch_id,
            recipient.log_id,
            chunk=chunk.index,
            link=link,
            scope=scope,
            url=url,
        )
        return sign(claim, tracker.ring)

    substitutions = dict(recipient.substitutions)
    for index, template in tracked.items():
        # A personal link's URL is this recipient's, substituted as the provider would; one
        # too long for a token goes untracked.
        own = keys.apply(template) if template and keys is not None else None
        if own is not None and len(own.encode()) > MAX_PERSONAL_URL:
            substitutions[click_key(index)] = html.escape(own, quote=True)
        else:
            substitutions[click_key(index)] = tracker.url("c", token("click", index, url=own))
    if opens:
        substitutions[OPEN_KEY] = token("open")
    headers = dict(recipient.headers)
    if unsubscribe:
        headers["List-Unsubscribe"] = list_unsubscribe(
            tracker, token("unsubscribe", scope=engagement.list)
        )
    return recipient.model_copy(update={"substitutions": substitutions, "headers": headers})


def list_unsubscribe(tracker: Tracker, token: str) -> str:
    """The List-Unsubscribe value: the one-click HTTPS URL first, then the mailto."""
    value = f"<{tracker.url('u', token)}>"
    if tracker.mailto:
        subject = urllib.parse.quote(f"unsubscribe {token}")
        value += f", <mailto:{tracker.mailto}?subject={subject}>"
    return value


def _with_pixel(body: str, src: str) -> str:
    """The html with a 1x1 image at the end of its body (or at the end)."""
    pixel = f'<img src="{src}" width="1" height="1" alt="" style="display:none">'
    at = body.lower().rfind("</body>")
    if at < 0:
        return body + pixel
    return body[:at] + pixel + body[at:]
