"""The guard on users' webhook endpoints (``shared.outbound.ssrf``): public https targets only."""

from __future__ import annotations

import ipaddress

import pytest

from shared.outbound.ssrf import (
    NAME_REFUSED,
    TargetError,
    address_problem,
    literal,
    parse_target,
    resolved_problem,
)


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",  # cloud metadata
        "100.64.0.1",  # carrier-grade NAT
        "0.0.0.0",
        "224.0.0.1",
        "::1",
        "fe80::1",
        "fc00::1",
        "::ffff:127.0.0.1",  # IPv4-mapped
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    ],
)
def test_addresses_inside_any_network_are_refused(address: str) -> None:
    assert address_problem(ipaddress.ip_address(address)) is not None


@pytest.mark.parametrize("address", ["93.184.215.14", "2606:4700:4700::1111"])
def test_public_addresses_pass(address: str) -> None:
    assert address_problem(ipaddress.ip_address(address)) is None


def test_an_operator_may_allow_a_network() -> None:
    internal = [ipaddress.ip_network("10.20.0.0/16")]

    assert address_problem(ipaddress.ip_address("10.20.3.4"), internal) is None
    assert address_problem(ipaddress.ip_address("10.21.3.4"), internal) is not None


def test_every_address_a_host_resolves_to_must_pass() -> None:
    public, private = ipaddress.ip_address("93.184.215.14"), ipaddress.ip_address("10.0.0.1")

    assert resolved_problem([public]) is None
    assert resolved_problem([public, private]) is not None
    assert resolved_problem([]) is not None


@pytest.mark.parametrize(
    "addresses",
    [
        [],
        ["127.0.0.1"],
        ["::1"],
        ["10.0.0.1"],
        ["169.254.169.254"],
        ["93.184.215.14", "192.168.1.1"],
        ["::ffff:127.0.0.1"],
        ["224.0.0.1"],
    ],
)
def test_a_refused_name_is_told_in_the_same_words_naming_no_address(addresses: list[str]) -> None:
    """What a name resolved to (or that it resolved at all) is never told: no address and
    no kind of address, the one message for every refusal (no internal DNS oracle)."""
    problem = resolved_problem([ipaddress.ip_address(a) for a in addresses])

    assert problem == NAME_REFUSED
    assert not any(a in problem for a in addresses)
    assert not any(w in problem for w in ("loopback", "link-local", "private", "multicast"))


def test_an_address_the_user_typed_may_be_named() -> None:
    """A literal tells the user nothing they did not write: its refusal may name it."""
    problem = address_problem(ipaddress.ip_address("127.0.0.1"))

    assert problem is not None and "127.0.0.1" in problem


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://example.com/hook", "https"),
        ("ftp://example.com/hook", "https"),
        ("https://user:pw@example.com/hook", "credentials"),
        ("https:///hook", "host"),
        ("https://example.com:99999/hook", "port"),
        ("https://exa mple.com/hook", "spaces"),
    ],
)
def test_a_url_that_cannot_be_an_endpoint_says_why(url: str, why: str) -> None:
    with pytest.raises(TargetError, match=why):
        parse_target(url)


def test_an_endpoint_url_is_taken_apart() -> None:
    target = parse_target("https://Hooks.Example.com./in")

    assert (target.scheme, target.host, target.port) == ("https", "hooks.example.com", 443)
    assert parse_target("http://h.example:8080/x", allow_http=True).port == 8080


def test_ip_literals_are_recognised() -> None:
    assert literal("[::1]") == ipaddress.ip_address("::1")
    assert literal("hooks.example.com") is None
