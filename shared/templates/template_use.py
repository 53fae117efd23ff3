"""A batch sent from a template (pure): rendering a version once for the whole batch, the
recipients' own values as provider substitutions, and which copy each chunk carries.

A version is rendered once per batch, not once per recipient: one request to a provider
carries up to a thousand recipients and one content. The batch's ``data`` fills the
template; a variable that is not in ``data`` is per recipient: it renders as a marker that
the provider replaces with that recipient's value from ``to[i].substitutions`` (SendGrid
substitutions, Mailgun recipient variables). The html part has a marker of its own, whose
value is html-escaped, so a recipient's name cannot inject markup; the subject and text
parts take the value as it is. A per-recipient variable can only be inserted as it is
(``{{ first_name }}``): a filter, a test or a comparison would act on the marker, not on
the value, so a template that transforms one or decides on one (``{% if vip %}``,
``first_name|length``, ``plan == "pro"``) is refused with the variable's name rather than
rendering the same wrong text for everyone.

A batch's copies are rendered in one job (:func:`render_batch`), run in
``shared.templates.template_pool``'s worker processes like every render of a user's template.

A canary rollout sends its version to a stable share of the recipients
(``shared.templates.canary.in_canary``): they are stored first, in chunks of their own, and the
batch remembers how many of its chunks carry the canary (:func:`message_for`). Which copy a
chunk is sent with is decided when it is sent (:func:`version_at_send`), from the template's
rollout as it stands then: once the judge rolls the canary back, the canary's chunks not yet
sent go with the live copy. The attempt records the version it was sent with
(``shared.delivery.attempts``), and readers take it from there (:func:`version_sent`).
"""

from __future__ import annotations

import html as html_lib
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, NoReturn

from shared.core.models import Message, TemplateCopy, TemplateUse
from shared.templates.canary import in_canary
from shared.templates.template_render import CompiledParts, RenderError, compile_part, render

#: Markers of per-recipient variables: ``[[sd.h.name]]`` in html, ``[[sd.t.name]]`` elsewhere.
_MARKER: Final = "[[sd.{part}.{name}]]"
#: The head of a marker: ``[[sd.``, its part's letter and a dot (any case, as ever).
_MARKER_HEAD: Final = re.compile(r"\[\[sd\.([a-z])\.", re.IGNORECASE)
#: What a marker starts with, whole or cut short.
_MARKER_START: Final = re.compile(r"\[\[sd\.", re.IGNORECASE)
#: Variable names a recipient may fill (Jinja2 identifiers of a sane length).
_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def marker(name: str, *, html_part: bool) -> str:
    return _MARKER.format(part="h" if html_part else "t", name=name)


@dataclass(frozen=True, slots=True)
class MarkerFound:
    """A marker found in a text: where it is, its part's letter and the name it holds."""

    start: int
    end: int
    part: str
    name: str


def markers_of(text: str) -> Iterator[MarkerFound]:
    """The markers of ``text`` in order: what ``\\[\\[sd\\.([a-z])\\.([^\\]]*)\\]\\]`` (any
    case) finds, as it always has, reading each character at most twice.

    That regular expression read to the next ``]`` from every head and, when that ``]``
    was alone, tried again at the next head, which reads to the same ``]``: quadratic in a
    run of unclosed markers. Every head before a lone ``]`` meets it first (a head holds no
    ``]``), so none of them closes and the scan goes on after it; when no ``]`` is left, no
    marker is."""
    at = text.find("[[")
    while at >= 0:
        head = _MARKER_HEAD.match(text, at)
        if head is None:
            at = text.find("[[", at + 1)
            continue
        close = text.find("]", head.end())
        if close < 0:
            return
        if text.startswith("]", close + 1):
            yield MarkerFound(at, close + 2, head.group(1), text[head.end() : close])
            at = text.find("[[", close + 2)
        else:
            at = text.find("[[", close + 1)


class Personal:
    """A per-recipient variable while a version renders once for the whole batch: printed,
    it is its marker; anything that needs its value (truth, comparison, length, an index,
    iteration, arithmetic) is refused, since the value is only known to the provider."""

    __slots__ = ("name", "text")

    def __init__(self, name: str, *, html_part: bool) -> None:
        self.name = name
        self.text = marker(name, html_part=html_part)

    def __str__(self) -> str:
        return self.text

    def __html__(self) -> str:
        return self.text

    def _refused(self, *_: object) -> NoReturn:
        raise RenderError(
            f"the per-recipient variable {self.name!r} is tested, compared or transformed: "
            "its value is each recipient's own and only known when the mail is sent, so it "
            "can only be inserted as it is ({{ " + self.name + " }}); put values the "
            "template decides on in data"
        )

    __bool__ = __len__ = __iter__ = __contains__ = __getitem__ = _refused
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _refused
    __add__ = __radd__ = __mul__ = __rmul__ = __mod__ = __int__ = __float__ = _refused
    __hash__ = object.__hash__


@dataclass(frozen=True, slots=True)
class Source:
    """A version's parts, as stored."""

    version: int
    subject: str
    html: str | None
    text: str | None


def variables(source: Source, parts: CompiledParts | None = None) -> frozenset[str]:
    """The variables a version uses (RenderError when it does not parse), each part
    compiled as it is rendered (through ``parts`` when given, which keeps it)."""
    names: set[str] = set()
    for part, html_part in ((source.subject, False), (source.html, True), (source.text, False)):
        if not part:
            continue
        if parts is not None:
            names |= parts.get(part, html_part=html_part).names
        else:
            names |= compile_part(part, html_part=html_part).names
    return frozenset(names)


def per_recipient(
    source: Source, data: Mapping[str, Any], parts: CompiledParts | None = None
) -> frozenset[str]:
    """The variables a version uses that ``data`` does not fill: each recipient's own."""
    return frozenset(n for n in variables(source, parts) if n not in data)


def subject_variables(copies: Iterable[TemplateCopy | None]) -> frozenset[str]:
    """The per-recipient variables whose values go into a subject of ``copies`` (a mail
    header: their values may not break a line)."""
    return frozenset(
        found.name for copy in copies if copy is not None for found in markers_of(copy.subject)
    )


def render_once(
    source: Source,
    data: Mapping[str, Any],
    personal: Iterable[str],
    parts: CompiledParts | None = None,
) -> TemplateCopy:
    """The version rendered with ``data``, each per-recipient variable as its marker (its
    parts compiled through ``parts`` when given).

    Raises RenderError when it does not render, or transforms a per-recipient variable."""
    names = sorted(personal)
    for name in names:
        if not _NAME.fullmatch(name):
            raise RenderError(f"{name!r} is not a variable name a recipient can fill")
    plain = {**data, **{n: Personal(n, html_part=False) for n in names}}
    rendered_text = render(source.subject, None, source.text, plain, parts=parts)
    rendered_html = (
        render(
            "",
            source.html,
            None,
            {**data, **{n: Personal(n, html_part=True) for n in names}},
            parts=parts,
        )
        if source.html
        else None
    )
    html = rendered_html.html if rendered_html else None
    text = rendered_text.text if source.text else (rendered_html.text if rendered_html else None)
    if text is not None and rendered_html is not None and not source.text:
        # The derived text part comes from the html: its markers are the html's.
        text = text.replace("[[sd.h.", "[[sd.t.")
    copy = TemplateCopy(version=source.version, subject=rendered_text.subject, html=html, text=text)
    _check_markers(copy, frozenset(names))
    return copy


@dataclass(frozen=True, slots=True)
class Rendering:
    """A batch's copies rendered, and the variables its recipients fill."""

    live: TemplateCopy
    canary: TemplateCopy | None
    personal: frozenset[str]


def render_batch(
    live: Source,
    canary: Source | None,
    data: Mapping[str, Any],
    parts: CompiledParts | None = None,
) -> Rendering:
    """The copies of ``live`` (and ``canary``) rendered once with ``data``: one job of the
    renderer per batch. Raises RenderError."""
    sources = [s for s in (live, canary) if s is not None]
    personal = frozenset[str]().union(*(per_recipient(s, data, parts) for s in sources))
    copies = [render_once(s, data, personal, parts) for s in sources]
    return Rendering(copies[0], copies[1] if len(copies) > 1 else None, personal)


def _check_markers(copy: TemplateCopy, names: frozenset[str]) -> None:
    for part, text in (
        ("subject", copy.subject),
        ("html", copy.html or ""),
        ("text", copy.text or ""),
    ):
        found = list(markers_of(text))
        if _MARKER_START.subn("", text)[1] != len(found):
            # A marker cut short (``truncate``, a slice of the printed text): the provider
            # would leave the fragment in the mail.
            raise RenderError(
                f"a per-recipient variable in the {part} is cut or transformed by a filter: "
                "a recipient's own value can only be inserted as it is ({{ name }}); put "
                "values to transform in data"
            )
        expected = "h" if part == "html" else "t"
        for one in found:
            if one.part != expected or one.name not in names:
                raise RenderError(
                    f"the per-recipient variable in {text[one.start : one.end]!r} ({part}) "
                    "is transformed "
                    "by a filter or an expression: a recipient's own value can only be "
                    "inserted as it is ({{ name }}); put values to transform in data"
                )


def recipient_substitutions(subs: Mapping[str, str], personal: Iterable[str]) -> dict[str, str]:
    """A recipient's values as the provider substitutions of the markers (html escaped)."""
    out: dict[str, str] = {}
    for name in personal:
        value = subs[name]
        out[marker(name, html_part=False)] = value
        out[marker(name, html_part=True)] = html_lib.escape(value, quote=True)
    return out


def canary_first(
    template_id: uuid.UUID, emails: Sequence[str], percent: float
) -> tuple[list[int], int]:
    """The recipients' order with the canary's first, and how many are in the canary."""
    canary = [i for i, e in enumerate(emails) if in_canary(template_id, e, percent)]
    chosen = set(canary)
    return canary + [i for i in range(len(emails)) if i not in chosen], len(canary)


def with_copy(message: Message, copy: TemplateCopy) -> Message:
    return message.model_copy(
        update={"subject": copy.subject, "html": copy.html, "text": copy.text}
    )


def message_for(message: Message, chunk: int) -> Message:
    """The message chunk ``chunk`` carries: the canary's copy for the canary's chunks."""
    use = message.template
    if use is None or use.canary is None or chunk >= use.canary_chunks:
        return message
    return with_copy(message, use.canary)


def version_for(message: Message, chunk: int) -> int | None:
    """The template version chunk ``chunk``'s recipients were meant to get when the batch was
    accepted (None: not from a template): what readers fall back to for attempts that
    recorded no version (written before versions were recorded, or not sent yet)."""
    use = message.template
    if use is None:
        return None
    if use.canary is not None and chunk < use.canary_chunks:
        return use.canary.version
    return use.version


def use_of(
    template_id: uuid.UUID,
    live: TemplateCopy,
    canary: TemplateCopy | None,
    canary_recipients: int,
    chunk_size: int,
    since: datetime | None = None,
) -> TemplateUse:
    """What a batch remembers of its template: the canary's chunks are the first ones."""
    chunks = -(-canary_recipients // chunk_size) if canary is not None else 0
    return TemplateUse(
        id=template_id,
        version=live.version,
        canary=canary if chunks else None,
        canary_chunks=chunks,
        canary_since=since if chunks else None,
    )


@dataclass(frozen=True, slots=True)
class TemplateState:
    """A template's rollout as it stands now: its live version and its canary's (None: no
    canary), with when that canary's rollout started."""

    live: int | None
    canary: int | None = None
    canary_since: datetime | None = None


#: Attempt states whose call may have reached the provider (its outcome was unknown).
MAY_HAVE_REACHED: Final = frozenset({"ambiguous", "resolved"})


def version_at_send(
    message: Message, chunk: int, rollout: TemplateState | None, kept: int | None = None
) -> int | None:
    """The template version chunk ``chunk`` is sent with now (None: not from a template).

    ``rollout`` is the template's rollout as it stands (None: the template is gone);
    ``kept`` the version an earlier call of the same line was made with when that call
    may have reached the provider (:func:`kept_version`): a recipient who may have the
    mail already gets the same copy again, never the other one.

    The live version's chunks get the live copy. A canary chunk gets the canary's copy
    while its canary is still the template's canary (the same version, in the same
    rollout) or has been promoted since (it is the live version now); once the canary was
    rolled back or replaced, or the template deleted, it gets the batch's live copy."""
    use = message.template
    if use is None:
        return None
    if kept in (use.version, use.canary.version if use.canary is not None else None):
        return kept
    if use.canary is None or chunk >= use.canary_chunks:
        return use.version
    canary = use.canary.version
    if rollout is None:
        return use.version
    same_rollout = use.canary_since is None or rollout.canary_since == use.canary_since
    if (rollout.canary == canary and same_rollout) or (
        rollout.canary is None and rollout.live == canary
    ):
        return canary
    return use.version


def kept_version(versions: Iterable[tuple[str, int | None]]) -> int | None:
    """The version a line's calls must keep (pure): that of its latest call that may have
    reached the provider (``(state, template_version)`` of each attempt, oldest first), if
    any. A call refused cleanly reached nobody: the next may go with another copy."""
    kept = None
    for state, version in versions:
        if state in MAY_HAVE_REACHED and version is not None:
            kept = version
    return kept


def message_at(message: Message, chunk: int, version: int | None) -> Message:
    """The message sent with template version ``version`` (the canary's copy when it is
    the canary's version); without one (an attempt that recorded none), the copy the batch
    meant for chunk ``chunk`` (:func:`message_for`)."""
    use = message.template
    if use is None:
        return message
    if version is None:
        return message_for(message, chunk)
    if use.canary is not None and version == use.canary.version:
        return with_copy(message, use.canary)
    return message


def version_sent(
    evidence: Iterable[str],
    chunk_line: Mapping[int, int | None],
    own_line: Mapping[int, int | None],
    fallback: int | None,
) -> int | None:
    """The template version a recipient got (pure): that of the attempt a provider took it
    by (its ``evidence`` tags, ``c.<n>`` or ``r.<n>``: its own re-sends before its chunk's),
    else that of the latest attempt of its chunk's line that recorded one (sent, or being
    sent); ``fallback`` (:func:`version_for`) when none did. ``chunk_line`` and
    ``own_line`` map each attempt's number to the version it recorded."""
    found: dict[str, tuple[int, int]] = {}
    for tag in evidence:
        kind, _, number = tag.partition(".")
        line = {"c": chunk_line, "r": own_line}.get(kind)
        version = line.get(int(number)) if line is not None and number.isdigit() else None
        if version is not None and (kind not in found or found[kind][0] < int(number)):
            found[kind] = (int(number), version)
    for kind in ("r", "c"):
        if kind in found:
            return found[kind][1]
    recorded = [v for _, v in sorted(chunk_line.items()) if v is not None]
    return recorded[-1] if recorded else fallback
