"""SendGrid v3 Mail Send body rules, as SendGrid judges a request before accepting it.

Pure functions over the decoded JSON body. ``validate`` returns every problem it finds (as
SendGrid does, "listing as many errors as possible"), each naming the offending field in
SendGrid's dotted form (``personalizations.0.to.1.email``).
"""

from __future__ import annotations

import binascii
from collections.abc import Mapping
from typing import Any

import orjson

from sandbox.sendgrid import FieldError, is_valid_address

MAX_PERSONALIZATIONS = 1000
#: Recipients across to + cc + bcc of every personalization.
MAX_RECIPIENTS = 1000
MAX_CATEGORIES = 10
MAX_CATEGORY_LENGTH = 255
#: ``custom_args`` (top level plus one personalization's) must stay below this, serialised.
MAX_CUSTOM_ARGS_BYTES = 10_000
#: ``send_at`` may schedule at most this far ahead.
MAX_SEND_AT_AHEAD = 72 * 3600
#: Headers the ``headers`` objects may not set (compared case-insensitively).
RESERVED_HEADERS = frozenset(
    h.lower()
    for h in (
        "x-sg-id",
        "x-sg-eid",
        "received",
        "dkim-signature",
        "Content-Type",
        "Content-Transfer-Encoding",
        "To",
        "From",
        "Subject",
        "Reply-To",
        "CC",
        "BCC",
    )
)

_HELP = "https://www.twilio.com/docs/sendgrid/api-reference/mail-send/errors#"
_KINDS = ("to", "cc", "bcc")


def validate(payload: object, *, now: float) -> list[FieldError]:
    """Every reason SendGrid would refuse this Mail Send body; empty when it is acceptable."""
    if not isinstance(payload, dict):
        return [FieldError("The request body must be a JSON object.", None)]
    errors: list[FieldError] = []
    _check_from(payload.get("from"), errors)
    _check_reply_to(payload, errors)
    _check_personalizations(payload, errors, now)
    _check_subject(payload, errors)
    _check_content(payload, errors)
    _check_categories(payload.get("categories"), errors)
    _check_attachments(payload.get("attachments"), errors)
    _check_headers(payload.get("headers"), "headers", errors)
    top_args = payload.get("custom_args")
    if (
        _check_custom_args(top_args, "custom_args", errors)
        and _args_size(top_args) >= MAX_CUSTOM_ARGS_BYTES
    ):
        errors.append(_custom_args_too_large("custom_args"))
    _check_send_at(payload.get("send_at"), "send_at", now, errors)
    template = payload.get("template_id")
    if template is not None and not isinstance(template, str):
        errors.append(FieldError("The template_id must be a string.", "template_id"))
    return errors


def _has_template(payload: Mapping[str, Any]) -> bool:
    template = payload.get("template_id")
    return isinstance(template, str) and bool(template)


def _check_from(sender: object, errors: list[FieldError]) -> None:
    if not isinstance(sender, dict) or not isinstance(sender.get("email"), str):
        errors.append(
            FieldError(
                "The from object must be provided for every email send. It is an object that "
                "requires the email parameter, but may also contain a name parameter.",
                "from.email",
                _HELP + "message.from",
            )
        )
    elif not is_valid_address(sender["email"], ascii_only=True):
        errors.append(
            FieldError(
                "The from email does not contain a valid address.",
                "from.email",
                _HELP + "message.from",
            )
        )


def _check_reply_to(payload: Mapping[str, Any], errors: list[FieldError]) -> None:
    reply_to = payload.get("reply_to")
    reply_list = payload.get("reply_to_list")
    if reply_to is not None and reply_list is not None:
        errors.append(FieldError("reply_to and reply_to_list cannot both be set.", "reply_to"))
    if reply_to is not None and not (
        isinstance(reply_to, dict) and is_valid_address(reply_to.get("email"))
    ):
        errors.append(
            FieldError("The reply_to email does not contain a valid address.", "reply_to.email")
        )
    if reply_list is None:
        return
    if not isinstance(reply_list, list) or not reply_list:
        errors.append(
            FieldError("The reply_to_list must be a non-empty array of emails.", "reply_to_list")
        )
        return
    for k, entry in enumerate(reply_list):
        if not (isinstance(entry, dict) and is_valid_address(entry.get("email"))):
            errors.append(
                FieldError("Does not contain a valid address.", f"reply_to_list.{k}.email")
            )


def _check_personalizations(
    payload: Mapping[str, Any], errors: list[FieldError], now: float
) -> None:
    items = payload.get("personalizations")
    if not isinstance(items, list) or not items:
        errors.append(
            FieldError(
                "The personalizations field is required and must have at least one "
                "personalization.",
                "personalizations",
                _HELP + "message.personalizations",
            )
        )
        return
    if len(items) > MAX_PERSONALIZATIONS:
        errors.append(
            FieldError(
                f"You may not have more than {MAX_PERSONALIZATIONS} personalizations per API "
                f"request; this request has {len(items)}.",
                "personalizations",
                _HELP + "message.personalizations",
            )
        )
        return
    seen: dict[str, str] = {}
    top_args = _args_size(payload.get("custom_args"))
    total = sum(
        _check_personalization(f"personalizations.{i}", p, seen, top_args, now, errors)
        for i, p in enumerate(items)
    )
    if total > MAX_RECIPIENTS:
        errors.append(
            FieldError(
                f"The total number of recipients (to, cc and bcc) must be at most "
                f"{MAX_RECIPIENTS} per request; this request has {total}.",
                "personalizations",
                _HELP + "message.recipient-limit",
            )
        )


def _check_personalization(
    base: str,
    item: object,
    seen: dict[str, str],
    top_args: int,
    now: float,
    errors: list[FieldError],
) -> int:
    """Check one personalization; return how many recipients it lists."""
    if not isinstance(item, dict):
        errors.append(FieldError("A personalization must be an object.", base))
        return 0
    to = item.get("to")
    if not isinstance(to, list) or not to:
        errors.append(
            FieldError(
                "The to array is required for all personalization objects, and must have at "
                "least one email object with a valid email address.",
                f"{base}.to",
                _HELP + "message.personalizations.to",
            )
        )
    count = _check_address_lists(base, item, seen, errors)
    subject = item.get("subject")
    if subject is not None and not isinstance(subject, str):
        errors.append(FieldError("The subject must be a string.", f"{base}.subject"))
    _check_headers(item.get("headers"), f"{base}.headers", errors)
    substitutions = item.get("substitutions")
    if substitutions is not None and not isinstance(substitutions, dict):
        errors.append(FieldError("The substitutions must be an object.", f"{base}.substitutions"))
    args = item.get("custom_args")
    if (
        _check_custom_args(args, f"{base}.custom_args", errors)
        and top_args + _args_size(args) >= MAX_CUSTOM_ARGS_BYTES
    ):
        errors.append(_custom_args_too_large(f"{base}.custom_args"))
    _check_send_at(item.get("send_at"), f"{base}.send_at", now, errors)
    return count


def _check_address_lists(
    base: str, item: Mapping[str, Any], seen: dict[str, str], errors: list[FieldError]
) -> int:
    count = 0
    for kind in _KINDS:
        entries = item.get(kind)
        if entries is None:
            continue
        if not isinstance(entries, list):
            errors.append(FieldError(f"The {kind} must be an array of email objects.", base))
            continue
        for j, entry in enumerate(entries):
            count += 1
            _check_recipient(entry, f"{base}.{kind}.{j}", f"{base}.{kind}", seen, errors)
    return count


def _check_recipient(
    entry: object, field: str, group: str, seen: dict[str, str], errors: list[FieldError]
) -> None:
    if not isinstance(entry, dict) or not is_valid_address(entry.get("email")):
        errors.append(
            FieldError(
                "Does not contain a valid address.",
                f"{field}.email",
                _HELP + "message.personalizations.to",
            )
        )
        return
    name = entry.get("name")
    if name is not None and not isinstance(name, str):
        errors.append(FieldError("The name must be a string.", f"{field}.name"))
    key = entry["email"].lower()
    first = seen.get(key)
    if first is None:
        seen[key] = group
    else:
        errors.append(
            FieldError(
                f"Each email address may appear only once per request. We found a duplicate "
                f"of {entry['email']} in the {group} field; it first appears in {first}.",
                group,
                _HELP + "message.personalizations",
            )
        )


def _check_subject(payload: Mapping[str, Any], errors: list[FieldError]) -> None:
    if _has_template(payload):
        return
    subject = payload.get("subject")
    if isinstance(subject, str) and subject:
        return
    items = payload.get("personalizations")
    if isinstance(items, list) and items and all(_has_own_subject(p) for p in items):
        return
    errors.append(
        FieldError(
            "The subject is required. You can get around this requirement if you use a "
            "template with a subject defined or if every personalization has a subject defined.",
            "subject",
            _HELP + "message.subject",
        )
    )


def _has_own_subject(item: object) -> bool:
    return isinstance(item, dict) and isinstance(item.get("subject"), str) and bool(item["subject"])


def _check_content(payload: Mapping[str, Any], errors: list[FieldError]) -> None:
    content = payload.get("content")
    if content is None and _has_template(payload):
        return
    if not isinstance(content, list) or not content:
        errors.append(
            FieldError(
                "Unless a valid template_id is provided, the content parameter is required. "
                "There must be at least one defined content block. We typically suggest both "
                "text/plain and text/html blocks are included, but only one block is required.",
                "content",
                _HELP + "message.content",
            )
        )
        return
    for k, block in enumerate(content):
        field = f"content.{k}"
        if not isinstance(block, dict):
            errors.append(FieldError("A content block must be an object.", field))
            continue
        kind = block.get("type")
        if not isinstance(kind, str) or not kind:
            errors.append(FieldError("The content type must be provided.", f"{field}.type"))
        elif kind.lower() == "text/plain" and k > 0:
            errors.append(
                FieldError(
                    "The text/plain content type must be first, followed by text/html.",
                    f"{field}.type",
                    _HELP + "message.content.type",
                )
            )
        value = block.get("value")
        if not isinstance(value, str) or not value:
            errors.append(
                FieldError(
                    "The content value must be a string at least one character in length.",
                    f"{field}.value",
                    _HELP + "message.content.value",
                )
            )


def _check_attachments(attachments: object, errors: list[FieldError]) -> None:
    """SendGrid's rules of ``attachments``: content and filename required, content base64,
    a disposition of ``inline`` or ``attachment``, and a content_id for an inline one."""
    if attachments is None:
        return
    if not isinstance(attachments, list):
        errors.append(FieldError("The attachments must be an array.", "attachments"))
        return
    for k, item in enumerate(attachments):
        field = f"attachments.{k}"
        if not isinstance(item, dict):
            errors.append(FieldError("An attachment must be an object.", field))
            continue
        content = item.get("content")
        if not isinstance(content, str) or not content:
            errors.append(
                FieldError("The attachment content is required.", f"{field}.content", _HELP)
            )
        elif not _is_base64(content):
            errors.append(
                FieldError(
                    "The attachment content must be base64 encoded.", f"{field}.content", _HELP
                )
            )
        filename = item.get("filename")
        if not isinstance(filename, str) or not filename:
            errors.append(FieldError("The attachment filename is required.", f"{field}.filename"))
        disposition = item.get("disposition", "attachment")
        if disposition not in ("inline", "attachment"):
            errors.append(
                FieldError("The disposition must be inline or attachment.", f"{field}.disposition")
            )
        if disposition == "inline" and not item.get("content_id"):
            errors.append(
                FieldError(
                    "The content_id is required when the disposition is inline.",
                    f"{field}.content_id",
                )
            )


def _is_base64(text: str) -> bool:
    try:
        binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):
        return False
    return True


def _check_categories(categories: object, errors: list[FieldError]) -> None:
    if categories is None:
        return
    if not isinstance(categories, list):
        errors.append(FieldError("The categories must be an array of strings.", "categories"))
        return
    if len(categories) > MAX_CATEGORIES:
        errors.append(
            FieldError(
                f"You may not have more than {MAX_CATEGORIES} categories per request.",
                "categories",
                _HELP + "message.categories",
            )
        )
    for k, category in enumerate(categories):
        if not isinstance(category, str):
            errors.append(FieldError("A category must be a string.", f"categories.{k}"))
        elif len(category) > MAX_CATEGORY_LENGTH:
            errors.append(
                FieldError(
                    f"A category cannot have more than {MAX_CATEGORY_LENGTH} characters.",
                    f"categories.{k}",
                    _HELP + "message.categories",
                )
            )


def _check_headers(headers: object, field: str, errors: list[FieldError]) -> None:
    if headers is None:
        return
    if not isinstance(headers, dict):
        errors.append(FieldError("The headers must be an object of string values.", field))
        return
    reserved = sorted(name for name in headers if name.lower() in RESERVED_HEADERS)
    if reserved:
        errors.append(
            FieldError(
                f"These headers are reserved and may not be set: {', '.join(reserved)}.",
                field,
                _HELP + "message.headers",
            )
        )
    if not all(isinstance(value, str) for value in headers.values()):
        errors.append(FieldError("Header values must be strings.", field))


def _check_custom_args(args: object, field: str, errors: list[FieldError]) -> bool:
    """Check the shape of a ``custom_args`` object; return whether it is well-formed."""
    if args is None:
        return True
    if not isinstance(args, dict):
        errors.append(FieldError("The custom_args must be an object of string values.", field))
        return False
    bad = sorted(key for key, value in args.items() if not isinstance(value, str))
    if bad:
        errors.append(
            FieldError(f"custom_args values must be strings (not: {', '.join(bad)}).", field)
        )
        return False
    return True


def _args_size(args: object) -> int:
    return len(orjson.dumps(args)) if isinstance(args, dict) and args else 0


def _custom_args_too_large(field: str) -> FieldError:
    return FieldError(
        f"The custom_args (top level plus personalization) must be smaller than "
        f"{MAX_CUSTOM_ARGS_BYTES} bytes.",
        field,
        _HELP + "message.custom_args",
    )


def _check_send_at(value: object, field: str, now: float, errors: list[FieldError]) -> None:
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool):
        errors.append(FieldError("The send_at must be a unix timestamp (integer).", field))
    elif value > now + MAX_SEND_AT_AHEAD:
        errors.append(
            FieldError(
                "The send_at may not be scheduled more than 72 hours in advance.",
                field,
                _HELP + "message.send_at",
            )
        )
