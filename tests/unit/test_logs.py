"""Logs are JSON lines carrying the service and the context bound around them."""

from __future__ import annotations

import io
import json
import logging

from shared.infra.logs import bound, configure_logging


def test_a_record_logged_inside_a_bound_block_carries_its_context(
    restored_logging: None,
) -> None:
    out = io.StringIO()
    configure_logging("INFO", service="consumers", fmt="json", stream=out)

    with bound(batch_id="b-1", attempt=2, log_id=None):
        logging.getLogger("services.consumers.calls").warning("attempt %d failed", 2)
    logging.getLogger("x").info("outside")

    inside, outside = (json.loads(line) for line in out.getvalue().splitlines())
    assert inside["event"] == "attempt 2 failed"
    assert inside["batch_id"] == "b-1" and inside["attempt"] == 2
    assert "log_id" not in inside
    assert inside["service"] == "consumers" and inside["level"] == "warning"
    assert inside["logger"] == "services.consumers.calls"
    assert "batch_id" not in outside


def test_console_format_is_one_readable_line(restored_logging: None) -> None:
    out = io.StringIO()
    configure_logging("INFO", service="api", fmt="console", stream=out)

    with bound(batch_id="b-2"):
        logging.getLogger("y").info("stored")

    line = out.getvalue().strip()
    assert "stored" in line and "batch_id=b-2" in line and "\n" not in line


def test_an_exception_is_rendered_into_the_json_line(restored_logging: None) -> None:
    out = io.StringIO()
    configure_logging("INFO", fmt="json", stream=out)

    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("z").exception("failed")

    record = json.loads(out.getvalue())
    assert "ValueError: boom" in record["exception"]


def test_httpx_request_lines_are_not_logged_at_info(restored_logging: None) -> None:
    out = io.StringIO()
    configure_logging("INFO", fmt="json", stream=out)

    logging.getLogger("httpx").info("HTTP Request: POST https://api.sendgrid.com/v3/mail/send")
    logging.getLogger("httpx").warning("retrying")

    assert [json.loads(line)["event"] for line in out.getvalue().splitlines()] == ["retrying"]
