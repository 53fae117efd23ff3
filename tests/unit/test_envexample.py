"""``.env.example`` says what the settings model and the deploy scripts read."""

from __future__ import annotations

import re
from pathlib import Path

from shared.ops.envexample import render

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_file_is_the_rendered_one() -> None:
    assert (ROOT / ".env.example").read_text() == render(), "run `make env-example`"


def test_every_variable_a_deploy_script_reads_is_listed() -> None:
    listed = set(re.findall(r"^# (SAFEDELIVR_[A-Z_]+)=", render(), flags=re.M))
    read = {
        name
        for script in (ROOT / "deploy" / "local").glob("*.sh")
        for name in re.findall(r"\$\{?(SAFEDELIVR_[A-Z_]+)", script.read_text())
    }
    assert read - listed == set()


def test_every_setting_is_listed_with_its_default() -> None:
    text = render()
    assert "# SAFEDELIVR_API_MAX_CONCURRENCY=256\n" in text
    assert "# SAFEDELIVR_STATS_BUCKETS=64\n" in text
    assert "# SAFEDELIVR_SANDBOX_SENDGRID_EMAIL_ACTIVITY=true\n" in text
    assert "# SAFEDELIVR_WEBHOOKS_SENDGRID_PUBLIC_KEY=\n" in text
