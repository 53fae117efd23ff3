"""Configuration validation at start-up (pure: monkeypatched environment only)."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from shared.core.errors import ConfigError
from shared.infra.config import CassandraSettings, ProviderSettings, load_settings


def test_defaults_load() -> None:
    """With no variables set the local defaults validate."""
    settings = load_settings()

    assert settings.api.port == 8080
    assert settings.providers.chain_codes == ("sg", "mg")


def test_bad_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad value stops start-up with a message naming the exact variable."""
    monkeypatch.setenv("SAFEDELIVR_CASSANDRA_PORT", "not-a-port")

    with pytest.raises(ConfigError, match="SAFEDELIVR_CASSANDRA_PORT"):
        load_settings()


def test_every_bad_variable_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """All problems are listed at once, not one per restart."""
    monkeypatch.setenv("SAFEDELIVR_API_PORT", "0")
    monkeypatch.setenv("SAFEDELIVR_PROVIDERS_CHAIN", "sg,postmark")

    with pytest.raises(ConfigError) as info:
        load_settings()

    assert "SAFEDELIVR_API_PORT" in str(info.value)
    assert "SAFEDELIVR_PROVIDERS_CHAIN" in str(info.value)


@pytest.mark.parametrize("keyspace", ["Bad-Name", "x;drop", "1abc", ""])
def test_keyspace_must_be_an_identifier(keyspace: str) -> None:
    """The keyspace is interpolated into CQL, so only plain identifiers pass."""
    with pytest.raises(ValidationError, match=r"keyspace\n.*must be a lowercase CQL identifier"):
        CassandraSettings(keyspace=keyspace)


@pytest.mark.parametrize(
    ("replication", "problem"),
    [
        ("{'class': 'SimpleStrategy'}; DROP KEYSPACE x", "must be a CQL map"),
        ("{'class': 'SimpleStrategy'}; DROP KEYSPACE x; {'class': 'x'}", "must not contain ';'"),
    ],
)
def test_replication_must_be_a_map(replication: str, problem: str) -> None:
    """Replication is a CQL map and may not smuggle a second statement."""
    with pytest.raises(ValidationError, match=rf"(?s)replication\n.*{re.escape(problem)}"):
        CassandraSettings(replication=replication)


def test_chain_rejects_duplicates_and_parses_backoff() -> None:
    """A provider may appear once; backoff tiers are whole positive seconds."""
    with pytest.raises(ValidationError, match=r"chain\n.*lists a provider twice"):
        ProviderSettings(chain="sg,sg")
    with pytest.raises(ValidationError, match=r"backoff\n.*needs at least one positive delay"):
        ProviderSettings(backoff="5,-1")
    assert ProviderSettings(backoff="1, 2").backoff_tiers == (1, 2)


def test_secrets_are_not_printed() -> None:
    """Secrets never appear in the settings' repr (which ends up in logs)."""
    text = repr(load_settings())

    assert "guest:guest" not in text
    assert "sandbox-sendgrid-key" not in text


def test_hooks_delays_and_networks_are_parsed() -> None:
    """Delays become tiers; allowed networks become networks."""
    from shared.infra.config import HooksSettings

    hooks = HooksSettings(delays="1,2,3", allowed_networks="10.0.0.0/8, ::1/128")

    assert hooks.delay_tiers == (1, 2, 3)
    assert [str(n) for n in hooks.networks] == ["10.0.0.0/8", "::1/128"]


@pytest.mark.parametrize(
    "values", [{"delays": "5,x"}, {"delays": "0"}, {"allowed_networks": "10.0.0.0/33"}]
)
def test_bad_hooks_settings_are_refused(values: dict[str, str]) -> None:
    """A delay that is not 1 s to a day, or a network that is not CIDR, fails at start-up."""
    from pydantic import ValidationError

    from shared.infra.config import HooksSettings

    with pytest.raises(ValidationError):
        HooksSettings(**values)  # type: ignore[arg-type]
