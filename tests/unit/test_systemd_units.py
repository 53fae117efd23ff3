"""The systemd units in deploy/systemd: each starts a real ``safedelivr`` command, the
services run one worker per core, and systemd itself accepts the files."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from services.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
INSTALLED = "/opt/safedelivr"


def _values(unit: Path, key: str) -> list[str]:
    return [
        line.split("=", 1)[1]
        for line in unit.read_text().splitlines()
        if line.startswith(f"{key}=")
    ]


def _commands(unit: Path) -> list[list[str]]:
    return [shlex.split(cmd) for cmd in _values(unit, "ExecStart")]


def test_every_service_has_a_unit_that_runs_one_worker_per_core() -> None:
    for service in ("api", "webhooks", "consumers", "hooks", "submission"):
        (argv,) = _commands(UNITS / f"safedelivr-{service}.service")
        assert argv == [f"{INSTALLED}/.venv/bin/safedelivr", service, "--workers", "auto"]


def test_every_command_of_every_unit_is_one_the_cli_accepts() -> None:
    commands = [argv for unit in UNITS.glob("*.service") for argv in _commands(unit)]
    assert {argv[1] for argv in commands} == {
        "api",
        "webhooks",
        "tracking",
        "consumers",
        "hooks",
        "submission",
        "migrate",
        "topology",
    }
    for argv in commands:
        build_parser().parse_args(argv[1:])  # exits (fails the test) on an unknown option


def test_the_target_wants_every_long_running_service() -> None:
    (wants,) = _values(UNITS / "safedelivr.target", "Wants")
    assert set(wants.split()) == {
        "safedelivr-api.service",
        "safedelivr-webhooks.service",
        "safedelivr-tracking.service",
        "safedelivr-consumers.service",
        "safedelivr-hooks.service",
        "safedelivr-submission.service",
    }


def test_systemd_accepts_the_units(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    for unit in UNITS.iterdir():
        # Pointed at this checkout, so the executables systemd checks for exist.
        (tmp_path / unit.name).write_text(unit.read_text().replace(INSTALLED, str(ROOT)))
    out = subprocess.run(
        [analyze, "verify", "--man=no", *sorted(str(p) for p in tmp_path.iterdir())],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr


def test_workers_auto_is_one_per_core_this_process_may_use() -> None:
    args = build_parser().parse_args(["consumers", "--workers", "auto"])
    assert args.workers == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_workers_must_be_a_positive_count_or_auto(value: str) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["api", "--workers", value])
