"""The pure side of live settings (``shared.ops.livesettings``): names and values checked and
made canonical, PATCH bodies flattened with errors naming the field, stored values resolved
over the environment's, and the running chain."""

from __future__ import annotations

import pytest

from shared.infra.config import ProviderSettings
from shared.ops.livesettings import (
    LiveSettings,
    SettingsError,
    check,
    flatten_patch,
    resolve,
    view,
)
from shared.providers.provider_health import HealthRules


@pytest.mark.parametrize(
    ("name", "value", "canonical"),
    [
        ("providers.chain", "mailgun, SendGrid", "mg,sg"),
        ("providers.chain", "sg", "sg"),
        ("providers.max_attempts", " 4 ", "4"),
        ("providers.sg.paused", "TRUE", "true"),
        ("providers.mg.paused", "off", "false"),
        ("providers.sg.rate_limit", "20", "20"),
        ("providers.sg.rate_limit", "2.50", "2.5"),
        ("providers.mg.rate_limit", "0", "0"),
    ],
)
def test_a_value_is_made_canonical(name: str, value: str, canonical: str) -> None:
    assert check(name, value) == canonical


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("providers.chain", "postmark"),
        ("providers.chain", "sg,sg"),
        ("providers.chain", " , "),
        ("providers.max_attempts", "0"),
        ("providers.max_attempts", "51"),
        ("providers.max_attempts", "²"),
        ("providers.max_attempts", "-1"),
        ("providers.sg.paused", "maybe"),
        ("providers.xx.paused", "true"),
        ("providers.timeout", "5"),
        ("providers.sg.rate_limit", "-1"),
        ("providers.sg.rate_limit", "nan"),
        ("providers.sg.rate_limit", "inf"),
        ("providers.sg.rate_limit", "fast"),
        ("", ""),
    ],
)
def test_a_bad_value_or_name_is_refused_naming_it(name: str, value: str) -> None:
    with pytest.raises(SettingsError) as caught:
        check(name, value)
    assert list(caught.value.fields) == [name]


def test_the_issues_examples_flatten_to_settings() -> None:
    """Names or codes, in any case."""
    assert flatten_patch({"providers": {"chain": ["mailgun", "sendgrid"]}}) == {
        "providers.chain": "mg,sg"
    }
    assert flatten_patch({"providers": {"sendgrid": {"paused": True}}}) == {
        "providers.sg.paused": "true"
    }
    assert flatten_patch({"providers": {"MG": {"paused": False}, "max_attempts": 3}}) == {
        "providers.mg.paused": "false",
        "providers.max_attempts": "3",
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "body"),
        ({}, "body"),
        ({"providers": {}}, "body"),
        ({"tracking": {"opens": True}}, "tracking"),
        ({"providers": "sg"}, "providers"),
        ({"providers": {"chain": "mg,sg"}}, "providers.chain"),
        ({"providers": {"chain": ["mg", 5]}}, "providers.chain"),
        ({"providers": {"chain": []}}, "providers.chain"),
        ({"providers": {"max_attempts": "4"}}, "providers.max_attempts"),
        ({"providers": {"max_attempts": True}}, "providers.max_attempts"),
        ({"providers": {"postmark": {"paused": True}}}, "providers.postmark"),
        ({"providers": {"sendgrid": {"paused": "yes"}}}, "providers.sendgrid.paused"),
        ({"providers": {"sendgrid": {"weight": 3}}}, "providers.sendgrid"),
        ({"providers": {"sendgrid": True}}, "providers.sendgrid"),
        (
            {"providers": {"sendgrid": {"rate_limit_per_s": "20"}}},
            "providers.sendgrid.rate_limit_per_s",
        ),
        (
            {"providers": {"sendgrid": {"rate_limit_per_s": -3}}},
            "providers.sendgrid.rate_limit_per_s",
        ),
    ],
)
def test_a_bad_patch_names_the_field(body: object, field: str) -> None:
    with pytest.raises(SettingsError) as caught:
        flatten_patch(body)
    assert field in caught.value.fields


def test_a_rate_limit_is_set_per_provider_and_zero_lifts_it() -> None:
    assert flatten_patch({"providers": {"sendgrid": {"rate_limit_per_s": 20}}}) == {
        "providers.sg.rate_limit": "20"
    }
    env = ProviderSettings(chain="sg,mg")
    live = resolve({"providers.sg.rate_limit": "20", "providers.mg.rate_limit": "0"}, env)
    assert live.limits() == {"sg": 20.0}


def test_the_alert_sink_and_its_thresholds_are_live_settings() -> None:
    changes = flatten_patch(
        {"alerts": {"webhook_url": "https://hooks.slack.com/services/x", "cool_off_s": 60}}
    )
    assert changes == {
        "alerts.webhook_url": "https://hooks.slack.com/services/x",
        "alerts.cool_off": "60",
    }
    live = resolve(changes, ProviderSettings())
    assert (live.alert_url, live.alert_cool_off, live.alert_queue_depth) == (
        "https://hooks.slack.com/services/x",
        60,
        10_000,
    )


@pytest.mark.parametrize(
    ("alerts", "field"),
    [
        ({"webhook_url": "ftp://x"}, "alerts.webhook_url"),
        ({"webhook_url": "http://a b"}, "alerts.webhook_url"),
        ({"cool_off_s": 1}, "alerts.cool_off_s"),
        ({"queue_depth": 0}, "alerts.queue_depth"),
        ({"queue_depth": True}, "alerts.queue_depth"),
        ({"email": "ops@example.com"}, "alerts.email"),
    ],
)
def test_a_bad_alert_setting_names_its_field(alerts: dict[str, object], field: str) -> None:
    with pytest.raises(SettingsError) as caught:
        flatten_patch({"alerts": alerts})
    assert list(caught.value.fields) == [field]


def test_stored_values_win_over_the_environment_and_bad_ones_are_ignored() -> None:
    env = ProviderSettings(chain="sg,mg", max_attempts=6)
    live = resolve(
        {"providers.chain": "mg,sg", "providers.sg.paused": "true", "providers.max_attempts": "x"},
        env,
    )
    assert live == LiveSettings(chain=("mg", "sg"), paused=frozenset({"sg"}), max_attempts=6)
    assert resolve({}, env) == LiveSettings(chain=("sg", "mg"), max_attempts=6)


@pytest.mark.parametrize(
    ("live", "running", "all_paused"),
    [
        (LiveSettings(("sg", "mg")), ("sg", "mg"), False),
        (LiveSettings(("mg", "sg")), ("mg", "sg"), False),
        (LiveSettings(("sg", "mg"), frozenset({"sg"})), ("mg",), False),
        (LiveSettings(("sg", "mg"), frozenset({"sg", "mg"})), ("sg", "mg"), True),
        (LiveSettings(("mg",)), ("mg",), False),
    ],
)
def test_the_running_chain_leaves_paused_providers_out_unless_all_are(
    live: LiveSettings, running: tuple[str, ...], all_paused: bool
) -> None:
    assert live.running_chain(("sg", "mg")) == running
    assert live.all_paused(("sg", "mg")) is all_paused


def test_a_chain_of_providers_this_process_lacks_falls_back_to_its_own() -> None:
    """A process configured with Mailgun alone keeps sending through Mailgun."""
    live = LiveSettings(("sg",))
    assert live.running_chain(("mg",)) == ("mg",)


def test_the_view_speaks_provider_names_as_patch_takes_them() -> None:
    shown = view(LiveSettings(("mg", "sg"), frozenset({"sg"}), 3))
    assert shown["providers"]["chain"] == ["mailgun", "sendgrid"]
    assert shown["providers"]["sendgrid"] == {
        "code": "sg",
        "paused": True,
        "rate_limit_per_s": None,
    }
    assert shown["providers"]["max_attempts"] == 3


def test_the_capacity_rules_are_live_settings_and_off_by_default() -> None:
    assert resolve({}, ProviderSettings()).capacity.enabled is False

    changes = flatten_patch(
        {"capacity": {"enabled": True, "initial_per_day": 5000, "max_bounce_rate": 0.02}}
    )
    live = resolve(changes, ProviderSettings())

    assert changes == {
        "capacity.enabled": "true",
        "capacity.initial": "5000",
        "capacity.max_bounce_rate": "0.02",
    }
    assert (live.capacity.enabled, live.capacity.initial, live.capacity.max_bounce_rate) == (
        True,
        5000,
        0.02,
    )
    assert view(live)["capacity"] == {
        "enabled": True,
        "initial_per_day": 5000,
        "max_bounce_rate": 0.02,
        "max_complaint_rate": 0.003,
    }


@pytest.mark.parametrize(
    ("capacity", "field"),
    [
        ({"enabled": "maybe"}, "capacity.enabled"),
        ({"initial_per_day": 5}, "capacity.initial_per_day"),
        ({"initial_per_day": 10.5}, "capacity.initial_per_day"),
        ({"max_bounce_rate": 5}, "capacity.max_bounce_rate"),
        ({"max_complaint_rate": 0}, "capacity.max_complaint_rate"),
        ({"max_bounce_rate": "nan"}, "capacity.max_bounce_rate"),
        ({"warmup": True}, "capacity.warmup"),
    ],
)
def test_a_bad_capacity_setting_names_its_field(capacity: dict[str, object], field: str) -> None:
    with pytest.raises(SettingsError) as caught:
        flatten_patch({"capacity": capacity})
    assert list(caught.value.fields) == [field]


def test_alerts_are_mailed_to_operators_named_as_a_list_or_a_string() -> None:
    as_list = flatten_patch(
        {
            "alerts": {
                "email_to": ["Ops@Example.com", "oncall@example.com", "ops@example.com"],
                "email_from": 'Safedelivr "Alerts" <alerts@example.com>',
                "error_burst": 20,
            }
        }
    )
    as_text = flatten_patch({"alerts": {"email_to": "Ops@Example.com, oncall@example.com"}})
    live = resolve(as_list, ProviderSettings())

    assert as_list["alerts.email_to"] == as_text["alerts.email_to"]
    assert live.alert_email_to == ("Ops@example.com", "oncall@example.com")
    assert live.alert_email_from == '"Safedelivr Alerts" <alerts@example.com>'
    assert live.alert_error_burst == 20
    assert view(live)["alerts"]["email_to"] == ["Ops@example.com", "oncall@example.com"]


@pytest.mark.parametrize(
    ("alerts", "field"),
    [
        ({"email_to": "not an address"}, "alerts.email_to"),
        ({"email_to": [f"o{i}@example.com" for i in range(21)]}, "alerts.email_to"),
        ({"email_to": [1, 2]}, "alerts.email_to"),
        ({"email_from": "a@example.com, b@example.com"}, "alerts.email_from"),
        ({"error_burst": 0}, "alerts.error_burst"),
    ],
)
def test_a_bad_alert_address_names_its_field(alerts: dict[str, object], field: str) -> None:
    with pytest.raises(SettingsError) as caught:
        flatten_patch({"alerts": alerts})
    assert list(caught.value.fields) == [field]


def test_the_health_thresholds_are_live_settings() -> None:
    changes = flatten_patch(
        {"providers": {"health": {"open_below": 0.3, "demote_below": 0.9, "cool_down_s": 60}}}
    )
    live = resolve(changes, ProviderSettings())

    assert changes == {
        "providers.health.open_below": "0.3",
        "providers.health.demote_below": "0.9",
        "providers.health.cool_down": "60",
    }
    assert (live.health.open_below, live.health.demote_below, live.health.cool_down) == (
        0.3,
        0.9,
        60.0,
    )
    assert view(live)["providers"]["health"]["probe_share"] == 0.1


def test_thresholds_that_contradict_each_other_are_ignored() -> None:
    stored = {"providers.health.open_below": "0.9", "providers.health.demote_below": "0.5"}

    assert resolve(stored, ProviderSettings()).health == HealthRules()


@pytest.mark.parametrize(
    ("health", "field"),
    [
        ({"open_below": 1.5}, "providers.health.open_below"),
        ({"probe_share": 0.9}, "providers.health.probe_share"),
        ({"cool_down_s": 1}, "providers.health.cool_down_s"),
        ({"cool_down_s": "60"}, "providers.health.cool_down_s"),
        ({"close_at": 0.9}, "providers.health.close_at"),
    ],
)
def test_a_bad_health_threshold_names_its_field(health: dict[str, object], field: str) -> None:
    with pytest.raises(SettingsError) as caught:
        flatten_patch({"providers": {"health": health}})
    assert list(caught.value.fields) == [field]
