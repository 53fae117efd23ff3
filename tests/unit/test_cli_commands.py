"""The ``safedelivr`` command line (services/cli.py) without services: which command each
argument list runs, the values it parses and refuses, and the exit status ``main`` maps
configuration errors, unreachable dependencies and Ctrl-C to."""

from __future__ import annotations

import argparse
import datetime as dt
import uuid

import pytest

from services import cli, usercli

#: Every command and sub-command, as typed after ``safedelivr``.
COMMANDS = [
    [],
    ["api"],
    ["webhooks"],
    ["consumers"],
    ["sandbox"],
    ["migrate"],
    ["topology"],
    ["dev"],
    ["keys"],
    ["keys", "create"],
    ["dead"],
    ["dead", "list"],
    ["dead", "replay"],
    ["dead", "delete"],
    ["stats"],
    ["stats", "reconcile"],
    ["check"],
    ["send"],
    ["batches"],
    ["logs"],
]


def _parse(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(list(argv))


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The usage error for ``argv``, after checking it exits with status 2."""
    with pytest.raises(SystemExit) as exited:
        _parse(*argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: " ".join(argv) or "safedelivr")
def test_every_command_has_help_that_renders(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--help`` exits 0 with a usage line (a stray ``%`` in a help text would crash it)."""
    with pytest.raises(SystemExit) as exited:
        _parse(*argv, "--help")

    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: safedelivr {' '.join(argv)}".rstrip())


@pytest.mark.parametrize(
    "argv",
    [[], ["deploy"], ["keys"], ["dead"], ["keys", "create"], ["keys", "revoke"], ["dead", "purge"]],
    ids=["nothing", "unknown", "keys alone", "dead alone", "no --user", "keys revoke", "purge"],
)
def test_a_missing_or_unknown_command_is_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing runs without a complete, known command."""
    assert "usage: safedelivr" in _refused(capsys, *argv)


def test_stats_alone_shows_stats_and_stats_reconcile_recounts() -> None:
    """``stats`` shares its name with the ``stats reconcile`` group yet runs on its own."""
    shown = _parse("stats", "--from", "2024-05-01")
    recount = _parse("stats", "reconcile", "--day", "2024-05-01")

    assert (shown.func, shown.start, shown.stats_command) == (usercli.cmd_stats, "2024-05-01", None)
    assert recount.func is cli.cmd_stats_reconcile
    assert (recount.day, recount.user, recount.fix) == (dt.date(2024, 5, 1), None, False)


@pytest.mark.parametrize("command", ["api", "webhooks", "consumers"])
def test_a_served_command_takes_a_port_and_defaults_to_one_worker(command: str) -> None:
    """``--port`` overrides the configured port; without it the settings decide."""
    args = _parse(command, "--port", "9001")

    assert (args.port, args.workers) == (9001, 1)
    assert _parse(command).port is None


def test_the_sandbox_runs_as_one_process(capsys: pytest.CaptureFixture[str]) -> None:
    """The sandbox keeps its state in memory, so it takes no ``--workers``."""
    assert "unrecognized arguments: --workers 2" in _refused(capsys, "sandbox", "--workers", "2")


@pytest.mark.parametrize("value", ["1.5", "", "auto2", "0x2"])
def test_workers_refuses_what_is_not_a_whole_count(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only a decimal count or ``auto``."""
    assert "is not a number or 'auto'" in _refused(capsys, "api", "--workers", value)


@pytest.mark.parametrize("command", [["check"], ["stats", "reconcile"]])
@pytest.mark.parametrize("day", ["2024-02-30", "yesterday", "05/01/2024", ""])
def test_a_day_that_is_not_a_calendar_date_is_refused(
    command: list[str], day: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--day`` must be a real YYYY-MM-DD date; the message quotes what was given."""
    err = _refused(capsys, *command, "--day", day)

    assert f"expected YYYY-MM-DD, not {day!r}" in err


@pytest.mark.parametrize("command", [["check"], ["stats", "reconcile"]])
def test_day_is_required(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """There is no default day to check or recount."""
    assert "the following arguments are required: --day" in _refused(capsys, *command)


@pytest.mark.parametrize("command", [["check"], ["stats", "reconcile"]])
def test_user_must_be_a_user_id(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """``--user`` takes the user's UUID (not a login), parsed into a UUID."""
    user = uuid.uuid4()

    args = _parse(*command, "--day", "2024-05-01", "--user", str(user).upper())
    err = _refused(capsys, *command, "--day", "2024-05-01", "--user", "octocat")

    assert args.user == user
    assert "expected a user id (UUID), not 'octocat'" in err


def test_check_defaults_and_refused_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    """No ``--settle-after`` means the computed default; numbers must be integers."""
    args = _parse("check", "--day", "2024-05-01")

    assert (args.settle_after, args.limit, args.user) == (None, 1000, None)
    assert "invalid int value" in _refused(
        capsys, "check", "--day", "2024-05-01", "--settle-after", "10m"
    )
    assert "invalid int value" in _refused(capsys, "check", "--day", "2024-05-01", "--limit", "all")


@pytest.mark.parametrize("action", ["list", "replay"])
def test_dead_letters_are_listed_or_replayed_with_a_limit(action: str) -> None:
    """Both actions run the same command, told apart by ``dead_command``; 100 by default."""
    default, limited = _parse("dead", action), _parse("dead", action, "--limit", "5")

    assert (default.func, default.dead_command, default.limit) == (cli.cmd_dead, action, 100)
    assert limited.limit == 5


def test_dead_letters_are_replayed_or_deleted_by_id() -> None:
    """Replay takes ids (or --all); delete needs at least one id."""
    replay = _parse("dead", "replay", "1-a", "2-b")
    every = _parse("dead", "replay", "--all")
    delete = _parse("dead", "delete", "1-a")

    assert (replay.ids, replay.all, every.ids, every.all) == (["1-a", "2-b"], False, [], True)
    assert (delete.func, delete.dead_command, delete.ids) == (cli.cmd_dead, "delete", ["1-a"])


def test_an_operator_key_adds_the_operator_scope() -> None:
    """``keys create --operator`` may use the operator routes (dead letters)."""
    assert _parse("keys", "create", "--user", "ops", "--operator").operator is True
    assert _parse("keys", "create", "--user", "ops").operator is False


def test_a_key_is_created_for_a_login_with_a_default_label() -> None:
    """``keys create --user LOGIN`` labels the key ``cli`` unless ``--name`` says otherwise."""
    default = _parse("keys", "create", "--user", "octocat")
    named = _parse("keys", "create", "--user", "octocat", "--name", "ci")

    assert (default.func, default.user, default.name) == (cli.cmd_keys_create, "octocat", "cli")
    assert named.name == "ci"


# -- main: exit statuses ----------------------------------------------------------------------


def test_a_bad_setting_exits_2_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Settings are validated before anything connects; the message names the variable."""
    monkeypatch.setenv("SAFEDELIVR_API_PORT", "0")

    code = cli.main(["topology"])

    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("safedelivr: invalid configuration:")
    assert "SAFEDELIVR_API_PORT" in err


@pytest.mark.usefixtures("restored_logging")  # main configures logging as its process would
@pytest.mark.parametrize(
    ("command", "variable", "value", "dependency"),
    [
        ("topology", "SAFEDELIVR_AMQP_URL", "amqp://guest:guest@127.0.0.1:1/", "rabbitmq"),
        ("migrate", "SAFEDELIVR_CASSANDRA_PORT", "1", "cassandra"),
    ],
)
def test_an_unreachable_dependency_exits_3_naming_it(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
    variable: str,
    value: str,
    dependency: str,
) -> None:
    """Nothing listens on port 1: a one-line error naming the dependency, status 3."""
    monkeypatch.setenv(variable, value)

    code = cli.main([command])

    assert code == 3
    assert f"safedelivr {command}: {dependency} unavailable" in capsys.readouterr().err


@pytest.mark.usefixtures("restored_logging")
def test_ctrl_c_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupted command exits as shells report SIGINT (128 + 2), without a traceback."""

    def interrupted(settings: object, args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_topology", interrupted)

    assert cli.main(["topology"]) == 130
