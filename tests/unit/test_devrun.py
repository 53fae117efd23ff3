"""``make run``'s supervisor (services/devrun.py) with real child processes: each service a
small Python process standing in for ``python -m services.cli <service>``, health answered
by this test once the child is up. Covers start-up order and failure, the environment the
children get, and that every stop (SIGHUP, SIGTERM, Ctrl-C, a crashed sibling) reaches each
living child exactly once."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import SecretStr

from sandbox import signing
from services import devrun
from shared.infra.config import (
    ApiSettings,
    ConsumerSettings,
    HooksSettings,
    SandboxSettings,
    Settings,
    SubmissionSettings,
    TrackingSettings,
    WebhookSettings,
)
from shared.providers import ses_events
from shared.providers.sendgrid_events import verify_signature

#: The services in the order devrun starts them.
ORDER = ("sandbox", "webhooks", "tracking", "consumers", "hooks", "api", "submission")

_CHILD = '''#!{python}
"""Stands in for `python -m services.cli <service>`: records what it was given, says it is
up, then waits for SIGINT (counting every one that arrives) as a draining service would."""
import json, os, signal, sys, time
from pathlib import Path

name = sys.argv[-1]
records = Path(os.environ["DEVRUN_TEST_RECORDS"])
behaviour = os.environ.get("DEVRUN_TEST_" + name.upper(), "serve")
received = []
signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
if behaviour == "fail-to-start":
    sys.exit(5)
(records / (name + ".json")).write_text(json.dumps({{
    "argv": sys.argv[1:],
    "env": {{k: v for k, v in os.environ.items() if k.startswith("SAFEDELIVR_")}},
    "own_group": os.getpgid(0) == os.getpid(),
}}))
(records / (name + ".ready")).touch()
with (records / (name + ".starts")).open("a") as starts:
    starts.write("started\\n")
# A second after it is up: past the supervisor's next health poll however late a loaded
# machine ran this child (it must see the service up before it sees it end).
if behaviour == "crash":
    time.sleep(1.0)
    sys.exit(4)
if behaviour == "retire-once" and not (records / (name + ".retired")).exists():
    (records / (name + ".retired")).touch()  # ends 0 on its own, as a retiring service does
    time.sleep(1.0)
    sys.exit(0)
deadline = time.monotonic() + 10
while not received and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(0.15)  # a second SIGINT arriving now is counted too
(records / (name + ".signals")).write_text(str(len(received)))
'''


def _health_handler(records: Path, name: str) -> type[BaseHTTPRequestHandler]:
    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            # Answer as soon as the child says it is up (no poll-interval wait), else 503;
            # within the supervisor's 2 s request timeout, however slowly the child starts.
            deadline = time.monotonic() + 1.5
            while not (records / f"{name}.ready").exists() and time.monotonic() < deadline:
                time.sleep(0.005)
            self.send_response(200 if (records / f"{name}.ready").exists() else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Health


@dataclass
class Run:
    """One supervised run: its settings, where the children write, and what they wrote."""

    settings: Settings
    records: Path
    started: threading.Event

    def record(self, name: str) -> dict[str, Any]:
        document: dict[str, Any] = json.loads((self.records / f"{name}.json").read_text())
        return document

    def started_services(self) -> list[str]:
        return [n for n in ORDER if (self.records / f"{n}.json").exists()]

    def signals(self) -> dict[str, int | None]:
        """SIGINTs each started child received (None: it never reported, e.g. it crashed)."""
        counts: dict[str, int | None] = {}
        for name in self.started_services():
            path = self.records / f"{name}.signals"
            counts[name] = int(path.read_text()) if path.exists() else None
        return counts


@pytest.fixture
def signals_restored() -> Iterator[None]:
    """devrun.run installs SIGTERM/SIGHUP handlers for its process; give pytest its own back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.fixture
def supervised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signals_restored: None
) -> Iterator[Run]:
    """devrun with its children replaced by stand-ins and its database set-up skipped."""
    records = tmp_path / "records"
    records.mkdir()
    child = tmp_path / "python"
    child.write_text(_CHILD.format(python=sys.executable))
    child.chmod(child.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(sys, "executable", str(child))
    monkeypatch.setenv("DEVRUN_TEST_RECORDS", str(records))
    monkeypatch.setattr(devrun, "_setup", lambda settings: "sd_live_demo")
    started = threading.Event()
    banner = devrun._banner

    def announce(settings: Settings, key: str) -> None:
        banner(settings, key)
        started.set()

    monkeypatch.setattr(devrun, "_banner", announce)
    servers = {n: ThreadingHTTPServer(("127.0.0.1", 0), _health_handler(records, n)) for n in ORDER}
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers.values()]
    for thread in threads:
        thread.start()
    port = {name: server.server_address[1] for name, server in servers.items()}
    settings = Settings(
        sandbox=SandboxSettings(port=port["sandbox"], mailgun_signing_key=SecretStr("mg-key")),
        webhooks=WebhookSettings(port=port["webhooks"]),
        tracking=TrackingSettings(port=port["tracking"]),
        consumers=ConsumerSettings(port=port["consumers"]),
        hooks=HooksSettings(port=port["hooks"]),
        api=ApiSettings(port=port["api"]),
        submission=SubmissionSettings(port=port["submission"]),
    )
    try:
        yield Run(settings, records, started)
    finally:
        for server in servers.values():
            server.shutdown()
            server.server_close()


def _once_started(run: Run, act: Callable[[], None]) -> threading.Thread:
    """Do ``act`` from another thread once every service is up and the banner printed."""

    def wait_then_act() -> None:
        if run.started.wait(10):
            act()

    thread = threading.Thread(target=wait_then_act, daemon=True)
    thread.start()
    return thread


def _signal_self(signum: int) -> Callable[[], None]:
    return lambda: os.kill(os.getpid(), signum)


# -- stopping -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "signum", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT], ids=["SIGHUP", "SIGTERM", "SIGINT"]
)
def test_a_stop_signal_reaches_every_service_exactly_once(supervised: Run, signum: int) -> None:
    """Hang-up, terminate or Ctrl-C: each service gets one SIGINT to drain on, and run ends 0."""
    _once_started(supervised, _signal_self(signum))

    code = devrun.run(supervised.settings)

    assert code == 0
    assert supervised.signals() == dict.fromkeys(ORDER, 1)


def test_each_service_runs_in_a_process_group_of_its_own(supervised: Run) -> None:
    """So a terminal's Ctrl-C reaches the supervisor alone, which then stops each service."""
    _once_started(supervised, _signal_self(signal.SIGHUP))

    devrun.run(supervised.settings)

    assert all(supervised.record(name)["own_group"] for name in ORDER)


def test_a_crashed_service_stops_the_others(
    supervised: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When one service dies the rest are stopped, each once; the dead one is not signalled."""
    monkeypatch.setenv("DEVRUN_TEST_CONSUMERS", "crash")

    devrun.run(supervised.settings)

    assert supervised.signals() == {
        "sandbox": 1,
        "webhooks": 1,
        "tracking": 1,
        "consumers": None,
        "hooks": 1,
        "api": 1,
        "submission": 1,
    }


def test_a_service_that_retired_itself_is_replaced_and_the_others_run_on(
    supervised: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service that ends on its own with status 0 (over its memory limit) is started
    again; the run goes on until stopped, and each service, the fresh one included, gets
    one SIGINT."""
    monkeypatch.setenv("DEVRUN_TEST_CONSUMERS", "retire-once")
    starts = supervised.records / "consumers.starts"

    def stop_once_replaced() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(starts.read_text().splitlines()) < 2:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    _once_started(supervised, stop_once_replaced)

    code = devrun.run(supervised.settings)

    assert code == 0
    assert len(starts.read_text().splitlines()) == 2
    assert supervised.signals() == dict.fromkeys(ORDER, 1)


def test_a_crashed_service_makes_the_run_fail(
    supervised: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that ended because a service died exits non-zero."""
    monkeypatch.setenv("DEVRUN_TEST_CONSUMERS", "crash")

    code = devrun.run(supervised.settings)

    assert code != 0


def test_a_service_that_cannot_start_stops_those_already_running(
    supervised: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Start-up fails naming the service and its status; later services are never started."""
    monkeypatch.setenv("DEVRUN_TEST_WEBHOOKS", "fail-to-start")

    with pytest.raises(RuntimeError, match=r"^webhooks exited with 5$"):
        devrun.run(supervised.settings)

    assert supervised.started_services() == ["sandbox"]
    assert supervised.signals() == {"sandbox": 1}


# -- what the children get and what is printed -----------------------------------------------


def test_services_start_in_order_as_safedelivr_commands(
    supervised: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each is ``-m services.cli <name>``; the banner lists each port and the demo key."""
    _once_started(supervised, _signal_self(signal.SIGHUP))

    devrun.run(supervised.settings)

    out = capsys.readouterr().out
    for name in ORDER:
        assert supervised.record(name)["argv"] == ["-m", "services.cli", name]
    listed = [line.split()[0] for line in out.splitlines() if "(pid " in line]
    assert listed == list(ORDER)
    ports = supervised.settings
    assert f"http://127.0.0.1:{ports.webhooks.port}/webhooks/" in out
    assert f"http://127.0.0.1:{ports.sandbox.port}  (SendGrid" in out
    assert "Demo API key (shown once): sd_live_demo" in out


def test_children_share_one_fresh_signing_pair_and_the_mailgun_key(
    supervised: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys made for this run replace stale ones from the environment; both halves match."""
    monkeypatch.setenv("SAFEDELIVR_SANDBOX_SENDGRID_PRIVATE_KEY", "stale")
    monkeypatch.setenv("SAFEDELIVR_WEBHOOKS_SENDGRID_PUBLIC_KEY", "stale")
    _once_started(supervised, _signal_self(signal.SIGHUP))

    devrun.run(supervised.settings)

    envs = [supervised.record(name)["env"] for name in ORDER]
    private = envs[0]["SAFEDELIVR_SANDBOX_SENDGRID_PRIVATE_KEY"]
    public = envs[0]["SAFEDELIVR_WEBHOOKS_SENDGRID_PUBLIC_KEY"]
    assert all(e["SAFEDELIVR_SANDBOX_SENDGRID_PRIVATE_KEY"] == private for e in envs)
    assert all(e["SAFEDELIVR_WEBHOOKS_SENDGRID_PUBLIC_KEY"] == public for e in envs)
    assert all(e["SAFEDELIVR_WEBHOOKS_MAILGUN_SIGNING_KEY"] == "mg-key" for e in envs)
    signature = signing.sign_sendgrid(signing.load_private_key(private), "1700000000", b"[]")
    assert verify_signature(public, signature, "1700000000", b"[]")


@pytest.mark.parametrize(("configured", "expected"), [(None, "console"), ("json", "json")])
def test_logs_are_readable_lines_unless_the_user_chose_a_format(
    supervised: Run, monkeypatch: pytest.MonkeyPatch, configured: str | None, expected: str
) -> None:
    """SAFEDELIVR_LOG_FORMAT defaults to console for the children; a set value wins."""
    if configured is None:
        monkeypatch.delenv("SAFEDELIVR_LOG_FORMAT", raising=False)
    else:
        monkeypatch.setenv("SAFEDELIVR_LOG_FORMAT", configured)
    _once_started(supervised, _signal_self(signal.SIGHUP))

    devrun.run(supervised.settings)

    assert {supervised.record(n)["env"]["SAFEDELIVR_LOG_FORMAT"] for n in ORDER} == {expected}


def test_every_signing_pair_is_new_and_verifies_only_its_own_signatures() -> None:
    """Two runs never share a key; one run's public key rejects the other's signature."""
    first, second = devrun._signing_env(), devrun._signing_env()
    body = b'[{"event":"delivered"}]'

    def signed(env: dict[str, str]) -> str:
        key = signing.load_private_key(env["SAFEDELIVR_SANDBOX_SENDGRID_PRIVATE_KEY"])
        return signing.sign_sendgrid(key, "1", body)

    public = second["SAFEDELIVR_WEBHOOKS_SENDGRID_PUBLIC_KEY"]
    assert first["SAFEDELIVR_WEBHOOKS_SENDGRID_PUBLIC_KEY"] != public
    assert verify_signature(public, signed(second), "1", body)
    assert not verify_signature(public, signed(first), "1", body)


# -- waiting for health -----------------------------------------------------------------------


@pytest.fixture
def answering() -> Iterator[Callable[[int], int]]:
    """Start a local server answering /healthz with a fixed status; returns its port."""
    servers: list[ThreadingHTTPServer] = []

    def start(status: int) -> int:
        class Fixed(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Fixed)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server.server_address[1]

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_healthy_answer_ends_the_wait(
    answering: Callable[[int], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 200 from /healthz means started (a wait that missed it would raise)."""
    monkeypatch.setattr(devrun, "START_TIMEOUT", 2.0)

    devrun._wait_healthy(devrun.Service("api", answering(200)))  # returns, raising nothing


def test_a_service_never_healthy_fails_after_the_start_timeout(
    answering: Callable[[int], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An endpoint answering 500 is not healthy; the wait gives up naming the URL."""
    monkeypatch.setattr(devrun, "START_TIMEOUT", 0.5)
    port = answering(500)

    with pytest.raises(RuntimeError, match=f"api did not answer .*:{port}/healthz within 0s"):
        devrun._wait_healthy(devrun.Service("api", port))


def test_a_service_whose_process_exited_fails_with_its_status() -> None:
    """No need to wait out the timeout once the process is gone."""
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])
    process.wait()

    with pytest.raises(RuntimeError, match=r"^consumers exited with 7$"):
        devrun._wait_healthy(devrun.Service("consumers", 1, process))


def test_provider_smtp_is_the_sandbox_relay(
    supervised: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every child points provider smtp at the port the sandbox's relay listens on."""
    monkeypatch.delenv("SAFEDELIVR_PROVIDERS_SMTP_PORT", raising=False)
    monkeypatch.delenv("SAFEDELIVR_SANDBOX_SMTP_PORT", raising=False)
    _once_started(supervised, _signal_self(signal.SIGHUP))

    devrun.run(supervised.settings)

    envs = [supervised.record(name)["env"] for name in ORDER]
    port = str(devrun.DEV_RELAY_PORT)
    assert {e["SAFEDELIVR_SANDBOX_SMTP_PORT"] for e in envs} == {port}
    assert {e["SAFEDELIVR_PROVIDERS_SMTP_PORT"] for e in envs} == {port}
    assert {e["SAFEDELIVR_PROVIDERS_SMTP_TLS"] for e in envs} == {"none"}


def test_every_provider_the_sandbox_stands_in_for_is_in_the_chain_by_default(
    supervised: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """So ``GET /v1/providers`` lists SendGrid, Mailgun, SES and the relay, and a batch may
    pin any of them."""
    monkeypatch.delenv("SAFEDELIVR_PROVIDERS_CHAIN", raising=False)
    _once_started(supervised, _signal_self(signal.SIGHUP))

    devrun.run(supervised.settings)

    envs = [supervised.record(name)["env"] for name in ORDER]
    assert {e["SAFEDELIVR_PROVIDERS_CHAIN"] for e in envs} == {"sg,mg,ses,smtp"}


def test_a_chain_the_user_chose_is_kept(supervised: Run) -> None:
    chosen = supervised.settings.model_copy(
        update={"providers": supervised.settings.providers.model_copy(update={"chain": "mg"})}
    )
    _once_started(supervised, _signal_self(signal.SIGHUP))

    devrun.run(chosen)

    envs = [supervised.record(name)["env"] for name in ORDER]
    assert {e.get("SAFEDELIVR_PROVIDERS_CHAIN") for e in envs} == {None}


def test_the_ses_pair_signs_what_the_pinned_certificate_verifies_for_the_sandboxs_topic() -> None:
    """The sandbox's SNS key of a run and the certificate the webhook service pins go
    together, and the sandbox's topic is the one allowed."""
    settings = Settings()
    env = devrun._ses_env(settings)
    key = signing.load_sns_key(env["SAFEDELIVR_SANDBOX_SES_SIGNING_KEY"])
    fields = {
        "Type": "Notification",
        "MessageId": "m-1",
        "TopicArn": settings.sandbox.ses_topic_arn,
        "Message": "{}",
        "Timestamp": "2026-11-30T05:00:00.000Z",
        "SignatureVersion": "2",
        "SigningCertURL": "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-0.pem",
    }
    raw = orjson.dumps({**fields, "Signature": signing.sign_sns(key, fields)})
    pinned = ses_events.signing_key(env["SAFEDELIVR_WEBHOOKS_SES_CERT_PEM"].encode())

    assert pinned is not None
    assert ses_events.verify_signature(ses_events.parse_envelope(raw), pinned)
    assert env["SAFEDELIVR_WEBHOOKS_SES_TOPIC_ARNS"] == settings.sandbox.ses_topic_arn
