"""The periodic look-ups of verified sending domains (``services.consumers.domain_checks``)
over the domain store's twin, a DNS stand-in and the lease's twin, on a clock the test moves."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from services.consumers.domain_checks import DomainChecker
from shared.accounts import domains
from shared.accounts.domain_checks import CheckRules
from shared.core.errors import DependencyUnavailable
from tests.fakes.accounts import FakeDomainStore
from tests.fakes.delivery import FakeSchedule, ScheduleTables

RULES = CheckRules(every=timedelta(hours=6), grace=timedelta(days=3))


@dataclass
class Dns:
    """TXT records by name; ``down`` plays a resolver that cannot answer."""

    records: dict[str, list[str]] = field(default_factory=dict)
    down: bool = False
    asked: list[str] = field(default_factory=list)

    async def txt(self, name: str) -> list[str]:
        self.asked.append(name)
        if self.down:
            raise DependencyUnavailable("dns", "the resolver answered HTTP 502")
        return list(self.records.get(name, ()))


def _whole_second_after(now: datetime) -> datetime:
    """A start for the test's clock that the store's own timestamps (the wall clock, to the
    millisecond) never pass within the test."""
    return now.replace(microsecond=0) + timedelta(seconds=2)


@dataclass
class Setting:
    store: FakeDomainStore = field(default_factory=FakeDomainStore)
    dns: Dns = field(default_factory=Dns)
    leases: ScheduleTables = field(default_factory=ScheduleTables)
    now: datetime = field(default_factory=lambda: _whole_second_after(datetime.now(UTC)))

    def checker(self) -> DomainChecker:
        return DomainChecker(
            self.store,
            self.dns,
            RULES,
            FakeSchedule("ns:domains", self.leases),
            clock=lambda: self.now,
        )

    async def verified(self, user: uuid.UUID, name: str) -> None:
        """``name`` verified by ``user``, its record published."""
        added = await self.store.add(user, name)
        self.dns.records[domains.record_name(name)] = [domains.record_value(added.token)]
        await self.store.mark_verified(user, name)

    def unpublish(self, name: str) -> None:
        del self.dns.records[domains.record_name(name)]

    def later(self, hours: float) -> None:
        self.now += timedelta(hours=hours)

    async def state(self, user: uuid.UUID, name: str) -> tuple[bool, datetime | None, str | None]:
        d = await self.store.get(user, name)
        assert d is not None
        return d.verified, d.missing_since, d.unverified_reason


async def test_a_domain_whose_record_vanished_is_unverified_after_the_grace() -> None:
    """Still verified while the grace runs (and its owner sees since when the record is
    missing); unverified at the first check after, with the reason."""
    s, user = Setting(), uuid.uuid4()
    await s.verified(user, "shop.example")
    checker = s.checker()
    s.unpublish("shop.example")

    s.later(6)
    first = await checker.pass_once()
    since = s.now
    during = await s.state(user, "shop.example")
    s.later(66)
    await checker.pass_once()
    still = await s.state(user, "shop.example")
    s.later(6)
    last = await checker.pass_once()
    verified, _, reason = await s.state(user, "shop.example")

    assert (first.missing, during) == (1, (True, since, None))
    assert still == (True, since, None)
    assert (last.unverified, verified) == (1, False)
    assert reason is not None and "_safedelivr.shop.example" in reason
    assert await s.store.verified(user) == frozenset()


async def test_a_record_back_within_the_grace_keeps_the_domain() -> None:
    s, user = Setting(), uuid.uuid4()
    await s.verified(user, "shop.example")
    token = s.dns.records[domains.record_name("shop.example")]
    checker = s.checker()
    s.unpublish("shop.example")
    s.later(6)
    await checker.pass_once()

    s.dns.records[domains.record_name("shop.example")] = token
    s.later(6)
    await checker.pass_once()
    s.later(100)
    await checker.pass_once()

    assert await s.state(user, "shop.example") == (True, None, None)


async def test_domains_are_looked_up_only_when_due_and_only_verified_ones() -> None:
    s, user = Setting(), uuid.uuid4()
    await s.verified(user, "shop.example")
    await s.store.add(user, "pending.example")
    checker = s.checker()

    s.later(1)
    early = await checker.pass_once()
    s.later(5)
    due = await checker.pass_once()
    again = await checker.pass_once()

    assert (early.looked_up, due.looked_up, due.seen, again.looked_up) == (0, 1, 1, 0)
    assert s.dns.asked == ["_safedelivr.shop.example"]


async def test_a_resolver_that_cannot_answer_decides_nothing() -> None:
    """Our outage never counts as a missing record, however long it lasts."""
    s, user = Setting(), uuid.uuid4()
    await s.verified(user, "shop.example")
    checker = s.checker()
    s.dns.down = True

    for _ in range(30):
        s.later(6)
        tally = await checker.pass_once()
        assert (tally.looked_up, tally.unanswered) == (1, 1)

    assert await s.state(user, "shop.example") == (True, None, None)


async def test_a_domain_verified_again_during_the_look_up_is_not_unverified() -> None:
    """The owner published the record and verified while the check (which had read the
    domain missing past its grace) was asking DNS: the check's write does not land."""
    s, user = Setting(), uuid.uuid4()
    await s.verified(user, "shop.example")
    token = s.dns.records[domains.record_name("shop.example")]
    checker = s.checker()
    s.unpublish("shop.example")
    s.later(6)
    await checker.pass_once()
    s.later(80)

    async def answered_late(name: str) -> list[str]:
        s.dns.records[name] = token
        await s.store.mark_verified(user, "shop.example")
        return []  # what the resolver saw before the owner's change reached it

    s.dns.txt = answered_late  # type: ignore[method-assign]
    tally = await checker.pass_once()

    assert (tally.looked_up, tally.unverified, tally.unanswered) == (1, 0, 1)
    assert await s.state(user, "shop.example") == (True, None, None)


async def test_one_checker_at_a_time_the_others_wait_for_the_lease() -> None:
    s, user = Setting(), uuid.uuid4()
    await s.verified(user, "shop.example")
    first, second = s.checker(), s.checker()

    s.later(6)
    ran = await first.pass_once()
    waited = await second.pass_once()

    assert (ran.looked_up, waited.looked_up) == (1, 0)


async def test_every_user_claiming_a_domain_is_checked_against_their_own_record() -> None:
    """The former owner's record is gone, the new owner's is there: only the former's
    claim lapses."""
    s, former, new = Setting(), uuid.uuid4(), uuid.uuid4()
    await s.verified(former, "shop.example")
    old_value = s.dns.records[domains.record_name("shop.example")]
    await s.verified(new, "shop.example")  # the zone now holds the new owner's value only
    assert s.dns.records[domains.record_name("shop.example")] != old_value
    checker = s.checker()

    for _ in range(14):
        s.later(6)
        await checker.pass_once()

    assert (await s.state(former, "shop.example"))[0] is False
    assert await s.state(new, "shop.example") == (True, None, None)
