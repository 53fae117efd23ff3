"""The ``domain_volume`` contract: what the capacity gate and the webhook service rely on from
:class:`shared.delivery.domain_capacity.DomainVolumes`, asserted of its twin and of the real
table."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

import pytest

from shared.delivery.domain_capacity import HISTORY_DAYS, DayVolume, DomainVolumes
from shared.infra.db import Database
from tests.conftest import unique
from tests.contracts.conftest import IMPLEMENTATIONS
from tests.fakes.delivery import FakeDomainVolumes

TODAY = date(2026, 11, 26)


@pytest.fixture(params=IMPLEMENTATIONS)
def volumes(request: pytest.FixtureRequest) -> Any:
    if request.param == "fake":
        return FakeDomainVolumes()
    db: Database = request.getfixturevalue("db")
    return DomainVolumes(db)


@pytest.fixture
def domain() -> str:
    return f"{unique('d')}.example.net"


async def test_take_answers_the_days_count_including_everyone_elses(
    volumes: Any, domain: str
) -> None:
    first = await volumes.take(domain, TODAY, 40)
    second = await volumes.take(domain, TODAY, 25)

    assert (first, second) == (40, 65)


async def test_what_is_given_back_is_not_counted(volumes: Any, domain: str) -> None:
    await volumes.take(domain, TODAY, 40)
    await volumes.give_back(domain, TODAY, 40)

    assert await volumes.take(domain, TODAY, 1) == 1


async def test_history_holds_each_days_sent_and_outcomes(volumes: Any, domain: str) -> None:
    yesterday = TODAY - timedelta(days=1)
    await volumes.take(domain, yesterday, 200)
    for kind in ("delivered", "delivered", "bounced", "complained"):
        await volumes.outcome(domain, yesterday, kind)
    await volumes.take(domain, TODAY, 3)

    history = await volumes.history(domain, TODAY)

    assert history == {
        yesterday: DayVolume(sent=200, delivered=2, bounced=1, complained=1),
        TODAY: DayVolume(sent=3),
    }


async def test_history_stops_at_the_window_and_at_the_domain(volumes: Any, domain: str) -> None:
    old = TODAY - timedelta(days=HISTORY_DAYS + 1)
    await volumes.take(domain, old, 5)
    await volumes.take(f"other.{domain}", TODAY, 5)

    assert await volumes.history(domain, TODAY) == {}


async def test_only_the_three_outcomes_are_counted(volumes: Any, domain: str) -> None:
    with pytest.raises(ValueError, match="not a counted outcome"):
        await volumes.outcome(domain, TODAY, "opened")
