"""The values live settings decide for a consumer process (``services.consumers.running``)."""

from __future__ import annotations

from services.consumers.running import Running
from shared.infra.config import ProviderSettings
from shared.ops.livesettings import LiveSettings


def test_before_live_settings_load_the_envs_chain_and_max_attempts_are_in_force() -> None:
    settings = ProviderSettings(chain="mg,sg", max_attempts=3)
    assert Running.start(settings) == Running(chain=("mg", "sg"), max_attempts=3)


def test_only_providers_this_process_has_can_be_paused_here() -> None:
    live = LiveSettings(chain=("sg", "mg"), paused=frozenset({"mg", "pm"}))
    assert Running.of(live, ("sg",), ("sg", "mg")).paused == frozenset({"mg"})


def test_the_chain_is_the_one_health_ordered_and_max_attempts_the_live_one() -> None:
    live = LiveSettings(chain=("sg", "mg"), max_attempts=2)
    running = Running.of(live, ("mg", "sg"), ("sg", "mg"))
    assert (running.chain, running.max_attempts) == (("mg", "sg"), 2)
