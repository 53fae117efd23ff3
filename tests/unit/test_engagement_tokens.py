"""Signed tokens in mail URLs (``shared.engagement.engagement_tokens``): authentic ones read back,
any change reads as nothing, keys rotate, and a click goes only to the link that was sent."""

from __future__ import annotations

import base64
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.core.keyring import KeyRing, ring_from
from shared.engagement.engagement_tokens import Claim, read, redirect_target, sign

OLD = KeyRing((("k1", b"o" * 32),))
NEW = KeyRing((("k2", b"n" * 32), ("k1", b"o" * 32)))
CLAIM = Claim("click", uuid.uuid1(), uuid.uuid4(), chunk=70_000, link=2)


def test_an_authentic_token_reads_back_its_claim() -> None:
    assert read(sign(CLAIM, OLD), OLD) == CLAIM


def test_a_token_signed_before_a_rotation_still_reads_while_its_key_is_in_the_ring() -> None:
    token = sign(CLAIM, OLD)

    assert read(token, NEW) == CLAIM
    assert read(token, KeyRing((("k2", b"n" * 32),))) is None
    assert sign(CLAIM, NEW).startswith("k2.")


@given(st.integers(0, 200), st.sampled_from("ABCabc0189-_."))
def test_any_changed_character_reads_as_nothing(position: int, char: str) -> None:
    token = sign(CLAIM, OLD)
    position %= len(token)
    changed = token[:position] + char + token[position + 1 :]

    assert changed == token or read(changed, OLD) is None


@pytest.mark.parametrize("junk", ["", "a.b", "a.b.c.d", "k1..", "x" * 600])
def test_junk_reads_as_nothing(junk: str) -> None:
    assert read(junk, OLD) is None


def test_a_click_goes_only_to_the_link_that_was_sent() -> None:
    links = ["https://shop.example/a", "https://shop.example/b", "https://shop.example/c"]

    assert redirect_target(CLAIM, links) == "https://shop.example/c"
    assert (
        redirect_target(Claim("click", CLAIM.batch_id, CLAIM.log_id, CLAIM.chunk, link=3), links)
        is None
    )
    assert redirect_target(Claim("open", CLAIM.batch_id, CLAIM.log_id), links) is None


def test_an_unsubscribe_token_carries_its_scope() -> None:
    claim = Claim("unsubscribe", CLAIM.batch_id, CLAIM.log_id, scope="list:news")

    assert read(sign(claim, NEW), NEW) == claim


def test_a_ring_is_read_from_its_setting() -> None:
    key = base64.b64encode(b"k" * 32).decode()

    assert ring_from(f"a1:{key}, b2:{key}").signing == ("a1", b"k" * 32)
    with pytest.raises(ValueError, match="kid:base64"):
        ring_from(key)
    with pytest.raises(ValueError, match="32 bytes"):
        ring_from("a1:" + base64.b64encode(b"short").decode())
