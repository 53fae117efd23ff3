"""The failover policy (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.consumers.failover import GiveUp, Retry, decide, provider_for
from shared.core.errors import (
    CapacityHeld,
    PermanentProviderError,
    ProviderMisconfigured,
    TransientProviderError,
    WorkCancelled,
)

CHAIN = ("sg", "mg")


def _decide(attempt: int, error: Exception, **kw: object) -> object:
    args: dict[str, object] = {
        "chain": CHAIN,
        "attempt": attempt,
        "error": error,
        "max_attempts": 6,
        "backoff": (5, 30),
    }
    args.update(kw)
    return decide(**args)  # type: ignore[arg-type]


def test_first_failure_moves_to_the_next_provider_at_once() -> None:
    """SendGrid failing sends the chunk to Mailgun as attempt 1, with no delay."""
    assert _decide(0, TransientProviderError("sg", "500")) == Retry("mg", 1, 0.0)


def test_wrapping_around_the_chain_waits_the_backoff_tier() -> None:
    """After every provider failed once, the next cycle starts after the first backoff tier."""
    assert _decide(1, TransientProviderError("mg", "503")) == Retry("sg", 2, 5)
    assert _decide(3, TransientProviderError("mg", "503")) == Retry("sg", 4, 30)


def test_last_backoff_tier_repeats() -> None:
    """Beyond the listed tiers the longest one is used again."""
    assert _decide(5, TransientProviderError("mg", "x"), max_attempts=10) == Retry("sg", 6, 30)


def test_attempt_limit_gives_up_with_a_reason() -> None:
    """When attempts run out the chunk fails, naming the chain and the last error."""
    result = _decide(5, TransientProviderError("mg", "503 unavailable"))

    assert isinstance(result, GiveUp)
    assert "all 6 attempts failed" in result.reason
    assert "503 unavailable" in result.reason


def test_single_provider_retries_itself_with_backoff() -> None:
    """With one provider configured, every retry cycles back to it after a delay."""
    assert _decide(0, TransientProviderError("sg", "x"), chain=("sg",)) == Retry("sg", 1, 5)


def test_work_of_a_provider_outside_the_chain_moves_to_the_chain_at_once() -> None:
    """A paused provider's job (SendGrid left out of the running chain) goes to Mailgun with
    no backoff: it is Mailgun's first try, not a wrap-around of the chain."""
    assert _decide(0, TransientProviderError("sg", "paused"), chain=("mg",)) == Retry("mg", 1, 0)
    assert _decide(3, TransientProviderError("sg", "paused"), chain=("mg",)) == Retry("mg", 4, 0)


def test_the_running_chain_still_backs_off_when_it_wraps() -> None:
    """Mailgun alone failing after taking SendGrid's work retries itself after the backoff."""
    assert _decide(1, TransientProviderError("mg", "503"), chain=("mg",)) == Retry("mg", 2, 30)


def test_retry_after_lengthens_the_wait_for_the_same_provider() -> None:
    """A 429's Retry-After is honoured when the same provider is next."""
    err = TransientProviderError("sg", "429", retry_after=60)
    assert _decide(0, err, chain=("sg",)) == Retry("sg", 1, 60)


def test_retry_after_does_not_delay_a_different_provider() -> None:
    """Another provider is tried at once even if the failing one asked us to wait."""
    assert _decide(0, TransientProviderError("sg", "429", retry_after=60)) == Retry("mg", 1, 0.0)


def test_misconfigured_provider_fails_over() -> None:
    """Bad credentials on one provider are a reason to use the next one."""
    assert _decide(0, ProviderMisconfigured("sg", "401")) == Retry("mg", 1, 0.0)


def test_permanent_rejection_skips_the_refusing_provider() -> None:
    """A provider that refused the payload as invalid is not tried again."""
    result = _decide(0, PermanentProviderError("sg", "bad"), chain=("sg", "mg"))
    assert result == Retry("mg", 1, 0.0)
    again = _decide(1, TransientProviderError("mg", "x"), permanent_from=frozenset({"sg"}))
    assert again == Retry("mg", 3, 5)


def test_rejected_by_every_provider_gives_up_at_once() -> None:
    """When every provider refused the payload, nothing more is tried."""
    result = _decide(1, PermanentProviderError("mg", "bad"), permanent_from=frozenset({"sg"}))
    assert isinstance(result, GiveUp)
    assert "rejected by every provider" in result.reason


@pytest.mark.parametrize(("attempt", "code"), [(0, "sg"), (1, "mg"), (2, "sg"), (5, "mg")])
def test_provider_for_walks_the_chain(attempt: int, code: str) -> None:
    """Attempt n goes to chain[n mod len(chain)]."""
    assert provider_for(CHAIN, attempt) == code


def test_turns_of_excluded_providers_use_up_no_attempts_and_the_same_provider_waits() -> None:
    """A recipient SendGrid and Mailgun dropped has SES left: each of its retries waits the
    backoff, and the turns passed over do not count against the limit."""
    chain = ("sg", "mg", "ses")
    excluded = frozenset({"sg", "mg"})
    first = _decide(1, TransientProviderError("ses", "429"), chain=chain, excluded=excluded)
    assert first == Retry("ses", 2, 5.0)
    again = _decide(
        2, TransientProviderError("ses", "429"), chain=chain, excluded=excluded, max_attempts=4
    )
    assert again == Retry("ses", 5, 5.0)


def test_attempt_limit_reason_names_the_chain_in_order_and_the_last_error() -> None:
    """The give-up reason users see lists the providers tried, then the last failure."""
    result = _decide(5, TransientProviderError("mg", "503 unavailable"))
    assert result == GiveUp("all 6 attempts failed across sg, mg; last: mg 503 unavailable")


def test_no_provider_left_after_exclusions_gives_up_at_once() -> None:
    """A re-send line whose only other provider is excluded stops instead of cycling."""
    result = _decide(0, TransientProviderError("sg", "500"), excluded=frozenset({"sg", "mg"}))
    assert result == GiveUp("no other provider is left to try; last: sg 500")


def test_work_held_at_its_domains_capacity_goes_to_the_same_provider_later() -> None:
    """No other provider has more capacity for the domain: no spill-over, and the wait is the
    longest backoff tier (then it is checked again), not the hours until the day renews."""
    held = CapacityHeld("mg", "at capacity", retry_after=20_000)

    assert _decide(5, held) == Retry("mg", 6, 30.0)


def test_held_work_of_a_provider_taken_out_of_the_chain_goes_to_the_chain() -> None:
    held = CapacityHeld("pm", "at capacity", retry_after=3)

    assert _decide(0, held) == Retry("sg", 1, 3.0)


def test_the_work_of_a_cancelled_campaign_ends_with_the_reason_on_any_attempt() -> None:
    cancelled = WorkCancelled("sg", "its campaign was cancelled")

    assert _decide(0, cancelled) == GiveUp("its campaign was cancelled")


# -- chains of any length (issue 36: N providers) ----------------------------------------------

_CODES = ("sg", "mg", "ses", "smtp", "p5")
_chains = st.integers(1, 5).flatmap(
    lambda n: st.permutations(_CODES).map(lambda codes: tuple(codes[:n]))
)


@given(chain=_chains)
def test_transient_failures_walk_the_whole_chain_in_order_then_back_off_once(
    chain: tuple[str, ...],
) -> None:
    """Each provider is tried once, in the chain's order, without waiting; the walk then
    starts again from the first after the first backoff tier."""
    attempt, seen, delays = 0, [chain[0]], []
    while len(seen) <= len(chain):
        step = decide(
            chain=chain,
            attempt=attempt,
            error=TransientProviderError(seen[-1], "503"),
            max_attempts=100,
            backoff=(5, 30),
        )
        assert isinstance(step, Retry)
        assert step.attempt == attempt + 1
        seen.append(step.provider)
        delays.append(step.delay)
        attempt = step.attempt
    assert seen == [*chain, chain[0]]
    assert delays == [0.0] * (len(chain) - 1) + [5.0]


@given(chain=_chains, data=st.data())
def test_no_attempt_goes_to_a_provider_that_refused_for_good_or_is_excluded(
    chain: tuple[str, ...], data: st.DataObject
) -> None:
    refused = frozenset(data.draw(st.sets(st.sampled_from(chain))))
    excluded = frozenset(data.draw(st.sets(st.sampled_from(chain))))
    failed = data.draw(st.sampled_from(chain))
    attempt = data.draw(st.integers(0, 20))
    step = decide(
        chain=chain,
        attempt=attempt,
        error=TransientProviderError(failed, "503"),
        max_attempts=25,
        backoff=(5, 30),
        permanent_from=refused,
        excluded=excluded,
    )
    if isinstance(step, Retry):
        assert step.provider not in refused | excluded
        assert attempt < step.attempt < 25
    else:
        assert isinstance(step, GiveUp)
        assert refused | excluded >= set(chain) or attempt + len(chain) >= 25
