"""The submission service's SMTP sessions on loopback, with an API that cannot be reached (what
these cases decide happens before any batch): the session limit answers 421, a password that
cannot be a key is refused without a call and without reaching the log, and a session may try
AUTH three times."""

from __future__ import annotations

import asyncio
import smtplib
from collections.abc import AsyncIterator

import httpx
import pytest

from services.submission.server import Submissions, serve
from shared.infra.config import SubmissionSettings
from shared.infra.gil import CpuLane


@pytest.fixture
async def port() -> AsyncIterator[int]:
    settings = SubmissionSettings(max_sessions=1)
    cpu = CpuLane("mime")
    # Nothing listens on port 9 of loopback: every call to the API fails to connect.
    async with httpx.AsyncClient(base_url="http://127.0.0.1:9") as api:
        listening = await serve(Submissions(api, settings, cpu), settings, port=0)
        try:
            yield listening.port
        finally:
            await listening.close(2.0)
            await cpu.aclose()


async def test_a_session_past_the_limit_is_told_421(port: int) -> None:
    def second_while_first_is_open() -> int:
        with smtplib.SMTP("127.0.0.1", port, timeout=10) as first:
            first.ehlo()
            try:
                smtplib.SMTP("127.0.0.1", port, timeout=10)
            except smtplib.SMTPConnectError as refused:
                return refused.smtp_code
            return 220

    assert await asyncio.to_thread(second_while_first_is_open) == 421


async def test_a_password_that_cannot_be_a_key_is_refused_and_not_logged(
    port: int, caplog: pytest.LogCaptureFixture
) -> None:
    def login() -> int:
        with smtplib.SMTP("127.0.0.1", port, timeout=10) as client:
            try:
                client.login("api", "sd_live_secret\r\nX-Injected: 1")
            except smtplib.SMTPAuthenticationError as refused:
                return refused.smtp_code
            return 235

    assert await asyncio.to_thread(login) == 535
    assert "sd_live_secret" not in caplog.text


async def test_a_session_may_try_auth_three_times(port: int) -> None:
    def tries() -> list[int]:
        codes = []
        with smtplib.SMTP("127.0.0.1", port, timeout=10) as client:
            client.ehlo()
            for _ in range(4):
                try:
                    codes.append(client.docmd("AUTH", "PLAIN AGFwaQBub3Q=")[0])  # \0api\0not
                except smtplib.SMTPServerDisconnected:
                    codes.append(0)
                    break
        return codes

    codes = await asyncio.to_thread(tries)
    assert codes[:3] == [454, 454, 454]  # the API cannot be asked: try again later
    assert codes[3] == 421
