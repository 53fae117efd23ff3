"""The ``safedelivr`` commands a sender uses (``send``, ``batches``, ``logs``, ``stats``): thin
wrappers over the typed client (``safedelivr_client``), so they talk to a running API over
HTTP like any other client, with an API key.

The key comes from ``--key`` or ``SAFEDELIVR_CLIENT_API_KEY``; the API from ``--api-url``,
``SAFEDELIVR_CLIENT_API_URL`` or ``SAFEDELIVR_API_PUBLIC_URL``. A value written ``@path``
is read from that file (``@-``: standard input).
"""

from __future__ import annotations

import argparse
import base64
import json
import mimetypes
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from safedelivr_client import ApiError, Client

from shared.infra.config import Settings

Command = Callable[[Settings, argparse.Namespace], int]


def add_commands(sub: Any, stats: argparse.ArgumentParser) -> None:
    """Register ``send``, ``batches`` and ``logs``, and make ``stats`` alone show stats."""
    send = sub.add_parser("send", help="submit a batch through the API")
    _connection(send)
    send.add_argument("--from", dest="sender", required=True, help="the sender address")
    send.add_argument("--to", action="append", required=True, help="a recipient (repeat)")
    send.add_argument("--subject", required=True)
    send.add_argument("--html", help="HTML body, or @file")
    send.add_argument("--text", help="plain-text body, or @file")
    send.add_argument(
        "--attach", action="append", default=[], metavar="PATH", help="attach a file (repeat)"
    )
    send.add_argument("--bulk", action="store_true", help="one copy per recipient")
    send.add_argument("--idempotency-key", help="default: one made for this command")
    send.set_defaults(func=cmd_send)

    batches = sub.add_parser("batches", help="list your batches, newest first")
    _connection(batches)
    batches.add_argument("--limit", type=int, default=20)
    batches.set_defaults(func=cmd_batches)

    logs = sub.add_parser("logs", help="each recipient of a batch and its state")
    _connection(logs)
    logs.add_argument("batch_id")
    logs.add_argument("--state", choices=("queued", "success", "failed"))
    logs.set_defaults(func=cmd_logs)

    _connection(stats)
    stats.add_argument("--from", dest="start", help="first day, YYYY-MM-DD")
    stats.add_argument("--to", dest="end", help="last day, YYYY-MM-DD")
    stats.set_defaults(func=cmd_stats)


def _connection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api-url", help="the API's base URL")
    parser.add_argument("--key", help="an API key (default: SAFEDELIVR_CLIENT_API_KEY)")
    parser.add_argument("--json", action="store_true", help="print the API's JSON")


def _client(settings: Settings, args: argparse.Namespace) -> Client:
    key = args.key or (
        settings.client.api_key.get_secret_value() if settings.client.api_key else None
    )
    if not key:
        raise SystemExit("safedelivr: an API key is needed: --key or SAFEDELIVR_CLIENT_API_KEY")
    return Client(_api_url(settings, args), key)


def _api_url(settings: Settings, args: argparse.Namespace) -> str:
    return str(args.api_url or settings.client.api_url or settings.api.public_url)


def value(text: str | None) -> str | None:
    """``text``, or the contents of the file it names as ``@path`` (``@-``: stdin)."""
    if text is None or not text.startswith("@"):
        return text
    name = text[1:]
    if name == "-":
        return sys.stdin.read()
    try:
        return Path(name).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SystemExit(f"safedelivr: cannot read {name}: {exc}") from None


def attachment(path: str) -> dict[str, str]:
    """The file at ``path`` as an ``attachments`` entry: its name, its type guessed from the
    name (``application/octet-stream`` when unknown) and its bytes in base64."""
    file = Path(path)
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise SystemExit(f"safedelivr: cannot read {path}: {exc}") from None
    return {
        "filename": file.name,
        "content_type": mimetypes.guess_type(file.name)[0] or "application/octet-stream",
        "content": base64.b64encode(data).decode("ascii"),
    }


def _run(settings: Settings, args: argparse.Namespace, call: Callable[[Client], Any]) -> Any:
    with _client(settings, args) as client:
        try:
            return call(client)
        except ApiError as exc:
            print(f"safedelivr {args.command}: {exc}", file=sys.stderr)
            for field, problem in exc.fields.items():
                print(f"  {field}: {problem}", file=sys.stderr)
            raise SystemExit(1) from None
        except httpx.TransportError as exc:
            print(
                f"safedelivr {args.command}: cannot reach {_api_url(settings, args)}: {exc}",
                file=sys.stderr,
            )
            raise SystemExit(3) from None


def _print(args: argparse.Namespace, data: Any, lines: list[str]) -> int:
    print(json.dumps(data, indent=2) if args.json else "\n".join(lines))
    return 0


def cmd_send(settings: Settings, args: argparse.Namespace) -> int:
    more: dict[str, Any] = {"bulk": True} if args.bulk else {}
    if args.attach:
        more["attachments"] = [attachment(path) for path in args.attach]
    accepted = _run(
        settings,
        args,
        lambda c: c.send(
            args.sender,
            args.to,
            args.subject,
            html=value(args.html),
            text=value(args.text),
            idempotency_key=args.idempotency_key,
            **more,
        ),
    )
    lines = [f"batch {accepted['batch_id']}: {accepted['accepted']} recipient(s) accepted"]
    lines += [f"  suppressed {email}" for email in accepted["suppressed"]]
    lines += [f"  rejected {r['email']}: {r['reason']}" for r in accepted["rejected"]]
    return _print(args, accepted, lines)


def cmd_batches(settings: Settings, args: argparse.Namespace) -> int:
    page = _run(settings, args, lambda c: c.batches(limit=args.limit))
    lines = [
        f"{b['batch_id']}  {b['created_at'][:19]}  {b['status']:<10} {b['recipients']:>6}  "
        f"{b['subject']}"
        for b in page["data"]
    ]
    return _print(args, page["data"], lines or ["no batches"])


def cmd_logs(settings: Settings, args: argparse.Namespace) -> int:
    entries = _run(settings, args, lambda c: list(c.iter_logs(args.batch_id, state=args.state)))
    lines = [
        f"{e['email']:<40} {e['state']:<8} {e['event']:<12} {e.get('reason') or ''}".rstrip()
        for e in entries
    ]
    return _print(args, entries, lines or ["no recipients"])


def cmd_stats(settings: Settings, args: argparse.Namespace) -> int:
    days = _run(settings, args, lambda c: c.stats(start=args.start, end=args.end))
    lines = [
        f"{d['date']}  queued {d['queued']:>7}  success {d['success']:>7}  failed {d['failed']:>7}"
        for d in days
    ]
    return _print(args, days, lines)
