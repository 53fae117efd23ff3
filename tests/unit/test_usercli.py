"""The sender commands (``safedelivr send|batches|logs|stats``, services/usercli.py): their
arguments, what they print and their exit status, against an in-process fake of the API
reached through the typed client's ``httpx.MockTransport`` seam."""

from __future__ import annotations

import io
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from safedelivr_client import Client

from services import cli, usercli
from shared.infra.config import ApiSettings, ClientSettings, Settings

Json = dict[str, Any]


def _error(status: int, code: str, message: str, fields: Json | None = None) -> httpx.Response:
    body: Json = {"code": code, "message": message}
    if fields:
        body["fields"] = fields
    return httpx.Response(status, json={"error": body})


@dataclass
class FakeApi:
    """The few routes the commands call, with the API's answer shapes and error bodies."""

    key: str
    batches: list[Json] = field(default_factory=list)
    logs: dict[str, list[Json]] = field(default_factory=dict)
    days: list[Json] = field(default_factory=list)
    page_size: int = 2
    requests: list[httpx.Request] = field(default_factory=list)
    sent: dict[str, Json] = field(default_factory=dict)
    bodies: list[Json] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.headers.get("authorization") != f"Bearer {self.key}":
            return _error(401, "unauthorized", "missing or invalid API key")
        path, params = request.url.path, request.url.params
        if (request.method, path) == ("POST", "/v1/batches"):
            return self._send(request)
        if path == "/v1/batches":
            limit = int(params.get("limit", "20"))
            return httpx.Response(200, json={"data": self.batches[:limit], "next_cursor": None})
        if match := re.fullmatch(r"/v1/batches/([^/]+)/logs", path):
            return self._logs(match[1], params)
        if path == "/v1/stats":
            return httpx.Response(200, json={"data": self.days})
        return _error(404, "not_found", "no such route")

    def _send(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        if "@" not in body["from"]:
            return _error(422, "invalid_fields", "the request has invalid fields", {"from": "bad"})
        key = request.headers["idempotency-key"]
        if key not in self.sent:
            valid = [a for a in body["to"] if "@" in a]
            self.sent[key] = {
                "batch_id": str(uuid.uuid4()),
                "accepted": sum(not a.startswith("gone") for a in valid),
                "suppressed": [a for a in valid if a.startswith("gone")],
                "rejected": [
                    {"email": a, "reason": "invalid"} for a in body["to"] if a not in valid
                ],
            }
        return httpx.Response(201, json=self.sent[key])

    def _logs(self, batch_id: str, params: httpx.QueryParams) -> httpx.Response:
        if batch_id not in self.logs:
            return _error(404, "not_found", "no such batch")
        state = params.get("state")
        entries = [e for e in self.logs[batch_id] if state in (None, e["state"])]
        start = int(params.get("cursor", "0"))
        end = start + self.page_size
        following = str(end) if end < len(entries) else None
        return httpx.Response(200, json={"data": entries[start:end], "next_cursor": following})


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    """A fake API the commands' client talks to, with a key of its own."""
    fake = FakeApi(key=f"sd_test_{uuid.uuid4().hex}")

    def client(url: str, key: str) -> Client:
        # No retries: a scripted answer is final, and a failure should show at once.
        return Client(url, key, transport=httpx.MockTransport(fake.handle), max_retries=0)

    monkeypatch.setattr(usercli, "Client", client)
    return fake


def _settings(
    *, key: str | None = None, url: str | None = None, public: str = "http://public.test"
) -> Settings:
    return Settings(
        client=ClientSettings(api_key=SecretStr(key) if key else None, api_url=url),
        api=ApiSettings(public_url=public),
    )


def _run(argv: list[str], settings: Settings | None = None) -> int:
    args = cli.build_parser().parse_args(argv)
    command: Callable[[Settings, Any], int] = args.func
    return command(settings or _settings(), args)


def _with(api: FakeApi, *argv: str) -> list[str]:
    return [*argv, "--api-url", "http://api.test", "--key", api.key]


def _send_argv(api: FakeApi, *extra: str, to: tuple[str, ...] = ("ann@example.com",)) -> list[str]:
    recipients = [arg for address in to for arg in ("--to", address)]
    return _with(api, "send", "--from", "shop@example.com", *recipients, "--subject", "Hi", *extra)


def _exit_code(excinfo: pytest.ExceptionInfo[SystemExit]) -> object:
    return excinfo.value.code


# -- send -----------------------------------------------------------------------------------


def test_send_prints_the_batch_and_each_suppressed_or_rejected_recipient(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    """One summary line, then one line per suppressed and per rejected address."""
    to = ("ann@example.com", "gone@example.com", "not-an-address")

    code = _run(_send_argv(api, "--text", "Hello", to=to))

    [accepted] = api.sent.values()
    assert code == 0
    assert capsys.readouterr().out.splitlines() == [
        f"batch {accepted['batch_id']}: 1 recipient(s) accepted",
        "  suppressed gone@example.com",
        "  rejected not-an-address: invalid",
    ]
    assert api.bodies == [
        {"from": "shop@example.com", "to": list(to), "subject": "Hi", "text": "Hello"}
    ]


def test_bulk_is_sent_only_when_asked_for(api: FakeApi) -> None:
    """``--bulk`` adds ``"bulk": true``; without it the field is absent, not false."""
    _run(_send_argv(api, "--bulk"))
    _run(_send_argv(api))

    assert [body.get("bulk", "absent") for body in api.bodies] == [True, "absent"]


def test_attach_sends_each_file_with_its_name_type_and_base64(api: FakeApi, tmp_path: Path) -> None:
    (tmp_path / "invoice.pdf").write_bytes(b"%PDF")
    (tmp_path / "data.zzz").write_bytes(b"\0")

    _run(_send_argv(api, "--text", "t", "--attach", str(tmp_path / "invoice.pdf"),
                    "--attach", str(tmp_path / "data.zzz")))  # fmt: skip

    [body] = api.bodies
    assert body["attachments"] == [
        {"filename": "invoice.pdf", "content_type": "application/pdf", "content": "JVBERg=="},
        {"filename": "data.zzz", "content_type": "application/octet-stream", "content": "AA=="},
    ]


def test_bodies_can_come_from_a_file_and_from_stdin(
    api: FakeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``@path`` reads a file and ``@-`` standard input, verbatim."""
    page = tmp_path / "mail.html"
    page.write_text("<p>Hello, file</p>\n")
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello, stdin\n"))

    _run(_send_argv(api, "--html", f"@{page}", "--text", "@-"))

    [body] = api.bodies
    assert (body["html"], body["text"]) == ("<p>Hello, file</p>\n", "Hello, stdin\n")


def test_the_same_idempotency_key_prints_the_same_batch(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    """A repeated ``--idempotency-key`` reaches the API as is, so a retry is one batch."""
    key = f"order-{uuid.uuid4().hex}"

    _run(_send_argv(api, "--idempotency-key", key))
    _run(_send_argv(api, "--idempotency-key", key))

    first, again = capsys.readouterr().out.splitlines()
    assert first == again
    assert [r.headers["idempotency-key"] for r in api.requests] == [key, key]


def test_without_an_idempotency_key_each_command_makes_a_fresh_one(api: FakeApi) -> None:
    """Two runs of the same command are two batches."""
    _run(_send_argv(api))
    _run(_send_argv(api))

    keys = [r.headers["idempotency-key"] for r in api.requests]
    assert len(set(keys)) == 2
    assert all(keys)


def test_send_json_prints_the_apis_answer(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    """``--json`` prints the answer document instead of the summary."""
    _run(_send_argv(api, "--json"))

    [accepted] = api.sent.values()
    assert json.loads(capsys.readouterr().out) == accepted


def test_an_invalid_batch_exits_1_listing_each_bad_field(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 422 ends the command with status 1 and the API's field problems on stderr."""
    argv = _with(api, "send", "--from", "nobody", "--to", "a@x.com", "--subject", "s")

    with pytest.raises(SystemExit) as exited:
        _run(argv)

    captured = capsys.readouterr()
    assert _exit_code(exited) == 1
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "safedelivr send: 422 invalid_fields: the request has invalid fields",
        "  from: bad",
    ]


@pytest.mark.parametrize("command", ["batches", "stats"])
def test_a_wrong_key_exits_1_with_the_apis_reason(
    api: FakeApi, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """A key the API refuses is a one-line error, not a traceback."""
    with pytest.raises(SystemExit) as exited:
        _run([command, "--api-url", "http://api.test", "--key", "sd_wrong"])

    assert _exit_code(exited) == 1
    assert capsys.readouterr().err == (
        f"safedelivr {command}: 401 unauthorized: missing or invalid API key\n"
    )


def test_without_any_key_the_command_stops_before_calling_the_api(api: FakeApi) -> None:
    """No ``--key`` and no SAFEDELIVR_CLIENT_API_KEY: a message naming both, and no request."""
    with pytest.raises(SystemExit) as exited:
        _run(["batches", "--api-url", "http://api.test"], _settings(key=None))

    assert "--key or SAFEDELIVR_CLIENT_API_KEY" in str(_exit_code(exited))
    assert api.requests == []


def test_the_configured_key_is_used_unless_one_is_given(api: FakeApi) -> None:
    """SAFEDELIVR_CLIENT_API_KEY is the default; ``--key`` overrides it."""
    configured = _settings(key=api.key)

    assert _run(["batches", "--api-url", "http://api.test"], configured) == 0
    with pytest.raises(SystemExit):
        _run(["batches", "--api-url", "http://api.test", "--key", "sd_other"], configured)

    assert [r.headers["authorization"] for r in api.requests] == [
        f"Bearer {api.key}",
        "Bearer sd_other",
    ]


@pytest.mark.parametrize(
    ("flag", "configured", "expected"),
    [
        ("http://flag.test", "http://client.test", "flag.test"),
        (None, "http://client.test", "client.test"),
        (None, None, "public.test"),
    ],
    ids=["--api-url", "client url", "public url"],
)
def test_the_api_url_comes_from_the_flag_then_the_client_then_the_public_url(
    api: FakeApi, flag: str | None, configured: str | None, expected: str
) -> None:
    """``--api-url`` wins, then SAFEDELIVR_CLIENT_API_URL, then SAFEDELIVR_API_PUBLIC_URL."""
    argv = ["batches", "--key", api.key, *(["--api-url", flag] if flag else [])]

    _run(argv, _settings(url=configured, public="http://public.test"))

    [request] = api.requests
    assert request.url.host == expected


# -- batches, logs, stats -------------------------------------------------------------------


def _batch(subject: str, status: str = "done", recipients: int = 3) -> Json:
    return {
        "batch_id": str(uuid.uuid4()),
        "subject": subject,
        "recipients": recipients,
        "created_at": "2024-05-01T12:34:56.789000+00:00",
        "status": status,
    }


def test_batches_prints_one_aligned_line_per_batch(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    """Id, creation second, status, recipient count and subject, in the API's order."""
    api.batches = [_batch("Newer", "sending", 12), _batch("Older")]

    assert _run(_with(api, "batches")) == 0

    newer, older = api.batches
    assert capsys.readouterr().out.splitlines() == [
        f"{newer['batch_id']}  2024-05-01T12:34:56  sending        12  Newer",
        f"{older['batch_id']}  2024-05-01T12:34:56  done            3  Older",
    ]


def test_batches_passes_the_limit_and_says_when_there_are_none(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--limit`` reaches the API; an empty page prints ``no batches``."""
    _run(_with(api, "batches", "--limit", "5"))

    assert api.requests[0].url.params["limit"] == "5"
    assert capsys.readouterr().out == "no batches\n"


def test_batches_json_prints_only_the_page_data(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--json`` prints the list of batches, without the paging envelope."""
    api.batches = [_batch("One")]

    _run(_with(api, "batches", "--json"))

    assert json.loads(capsys.readouterr().out) == api.batches


def _entry(email: str, state: str = "success", reason: str | None = None) -> Json:
    event = {"success": "delivered", "failed": "bounce", "queued": "queued"}[state]
    return {"email": email, "state": state, "event": event, "reason": reason}


def test_logs_follows_every_page_of_the_batch(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    """All recipients are printed, across pages, without trailing blanks."""
    batch_id = str(uuid.uuid4())
    api.logs[batch_id] = [_entry(f"r{i}@example.com") for i in range(5)]
    api.logs[batch_id][3] = _entry("r3@example.com", "failed", "mailbox full")

    assert _run(_with(api, "logs", batch_id)) == 0

    lines = capsys.readouterr().out.splitlines()
    assert len(api.requests) == 3
    assert [line.split()[0] for line in lines] == [f"r{i}@example.com" for i in range(5)]
    assert lines[3] == f"{'r3@example.com':<40} failed   bounce       mailbox full"
    assert lines[0] == f"{'r0@example.com':<40} success  delivered"


def test_logs_filters_by_state_at_the_api(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    """``--state`` is a query parameter; a batch with none in that state says so."""
    batch_id = str(uuid.uuid4())
    api.logs[batch_id] = [_entry("a@example.com"), _entry("b@example.com", "failed", "x")]

    _run(_with(api, "logs", batch_id, "--state", "failed"))
    _run(_with(api, "logs", batch_id, "--state", "queued"))

    assert [r.url.params["state"] for r in api.requests] == ["failed", "queued"]
    assert capsys.readouterr().out.splitlines()[1:] == ["no recipients"]


def test_logs_of_an_unknown_batch_exits_1(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    """A 404 is a one-line error with status 1."""
    with pytest.raises(SystemExit) as exited:
        _run(_with(api, "logs", str(uuid.uuid4())))

    assert _exit_code(exited) == 1
    assert capsys.readouterr().err == "safedelivr logs: 404 not_found: no such batch\n"


def test_stats_passes_the_range_and_prints_a_line_per_day(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--from``/``--to`` become ``from``/``to``; each day shows its three counts."""
    day = {"queued": 1, "success": 20, "failed": 300, "bounced": 0}
    api.days = [{"date": "2024-05-01", **day}, {"date": "2024-05-02", **day, "queued": 0}]

    _run(_with(api, "stats", "--from", "2024-05-01", "--to", "2024-05-02"))

    assert dict(api.requests[0].url.params) == {"from": "2024-05-01", "to": "2024-05-02"}
    assert capsys.readouterr().out.splitlines() == [
        "2024-05-01  queued       1  success      20  failed     300",
        "2024-05-02  queued       0  success      20  failed     300",
    ]


# -- arguments and failures ------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["send", "--from", "a@x.com", "--subject", "s"],
        ["send", "--to", "a@x.com", "--subject", "s"],
        ["send", "--from", "a@x.com", "--to", "a@x.com"],
        ["logs"],
        ["logs", "b-1", "--state", "bounced"],
        ["batches", "--limit", "many"],
    ],
    ids=["no --to", "no --from", "no --subject", "no batch id", "unknown state", "bad limit"],
)
def test_bad_arguments_exit_2_before_anything_is_called(
    api: FakeApi, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse refuses them with a usage message."""
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(argv)

    assert _exit_code(exited) == 2
    assert "usage: safedelivr" in capsys.readouterr().err
    assert api.requests == []


@pytest.mark.parametrize("text", [None, "", "plain", "a@b.c", " @not-a-file"])
def test_a_value_not_starting_with_at_is_itself(text: str | None) -> None:
    """Only a leading ``@`` names a file."""
    assert usercli.value(text) == text


@pytest.mark.usefixtures("restored_logging")  # cli.main configures logging
def test_a_body_file_that_does_not_exist_is_a_one_line_error(
    api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing ``@file`` ends the command with a message naming the file."""
    missing = tmp_path / "missing.html"

    with pytest.raises(SystemExit) as exited:
        cli.main(_send_argv(api, "--html", f"@{missing}"))

    assert _exit_code(exited) not in (0, None)
    assert str(missing) in str(exited.value.code) + capsys.readouterr().err
    assert api.requests == []


@pytest.mark.usefixtures("restored_logging")  # cli.main configures logging
def test_an_unreachable_api_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """When the API cannot be reached the command says so and exits non-zero."""

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    monkeypatch.setattr(
        usercli,
        "Client",
        lambda url, key: Client(url, key, transport=httpx.MockTransport(refuse), max_retries=0),
    )

    with pytest.raises(SystemExit) as exited:
        cli.main(["batches", "--api-url", "http://api.test", "--key", "sd_k"])

    assert _exit_code(exited) == 3
    err = capsys.readouterr().err
    assert "safedelivr batches: cannot reach http://api.test" in err
    assert "Traceback" not in err
