"""Sending one event to a user's endpoint: the SSRF guard at delivery, the pinned address,
the signed request, and failures as data. The endpoint is scripted at the transport."""

from __future__ import annotations

import ipaddress

import httpx
import pytest

from shared.outbound import outbound_signing
from shared.outbound.hook_delivery import Deliverer, host_header, pinned_url, vet
from shared.outbound.ssrf import NAME_REFUSED, IPAddress, Target, TargetError

SECRET = outbound_signing.new_secret()
PUBLIC = ipaddress.ip_address("93.184.216.34")


def _resolver(*addresses: str):  # type: ignore[no-untyped-def]
    async def resolve(host: str, port: int) -> list[IPAddress]:
        return [ipaddress.ip_address(a) for a in addresses]

    return resolve


def _deliverer(handler, *addresses: str, **kw: object) -> Deliverer:  # type: ignore[no-untyped-def]
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return Deliverer(http, resolver=_resolver(*(addresses or ("93.184.216.34",))), **kw)  # type: ignore[arg-type]


async def test_a_name_resolving_to_a_private_address_is_refused() -> None:
    """One private address among the answers is enough (a rebinding name)."""
    target = Target("https", "hooks.example", 443)

    with pytest.raises(TargetError) as refused:
        await vet(target, (), _resolver("93.184.216.34", "10.0.0.7"))

    assert str(refused.value) == NAME_REFUSED


async def test_an_operator_allowed_network_passes() -> None:
    """Loopback is fine when the operator allowed it."""
    target = Target("http", "localhost", 8090)
    allowed = (ipaddress.ip_network("127.0.0.0/8"),)

    assert str(await vet(target, allowed, _resolver("127.0.0.1"))) == "127.0.0.1"


async def test_a_literal_metadata_address_is_refused_without_resolving() -> None:
    """169.254.169.254 is link-local."""
    with pytest.raises(TargetError, match="link-local"):
        await vet(Target("https", "169.254.169.254", 443), (), _resolver())


def test_the_connection_goes_to_the_vetted_address_under_the_original_host() -> None:
    """The URL names the address; Host keeps the name (and its port when not default)."""
    target = Target("https", "hooks.example", 8443)

    assert pinned_url(target, PUBLIC, "https://hooks.example:8443/in?x=1") == (
        "https://93.184.216.34:8443/in?x=1"
    )
    assert host_header(target) == "hooks.example:8443"
    assert host_header(Target("https", "hooks.example", 443)) == "hooks.example"


async def test_a_delivery_is_signed_and_sent_to_the_pinned_address() -> None:
    """POST, JSON, the three Standard Webhooks headers verifying with the secret, SNI kept."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(204)

    outcome = await _deliverer(handler).send(
        "https://hooks.example/in", "msg_1", b'{"a":1}', [SECRET], 1_700_000_000
    )

    (request,) = seen
    assert outcome.status == 204 and outcome.error is None
    assert request.method == "POST"
    assert request.url.host == "93.184.216.34"
    assert request.headers["host"] == "hooks.example"
    assert request.headers["content-type"] == "application/json"
    assert request.extensions["sni_hostname"] == "hooks.example"
    headers = {
        k: request.headers[k] for k in ("webhook-id", "webhook-timestamp", "webhook-signature")
    }
    assert outbound_signing.verify(headers, b'{"a":1}', SECRET, now=1_700_000_000) is None


async def test_a_refused_target_is_never_called() -> None:
    """The guard's reason is the outcome's error (the delivery log's, shown to the user),
    naming neither what the name resolved to nor its kind; no request is made."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    outcome = await _deliverer(handler, "127.0.0.1").send(
        "https://hooks.example/in", "msg_1", b"{}", [SECRET], 1_700_000_000
    )

    assert seen == []
    assert outcome.status is None and outcome.error == f"refused: {NAME_REFUSED}"


async def test_a_name_that_does_not_resolve_is_refused_without_the_resolvers_words() -> None:
    """A resolver error reads like any other refusal of a name (its text could tell which
    internal names exist)."""

    async def failing(host: str, port: int) -> list[IPAddress]:
        raise OSError(-2, "Name or service not known")

    with pytest.raises(TargetError) as refused:
        await vet(Target("https", "db.internal", 443), (), failing)

    assert str(refused.value) == NAME_REFUSED


async def test_an_ip_literal_the_user_typed_is_named_in_its_refusal() -> None:
    """The user wrote the address: saying what is wrong with it reveals nothing."""
    with pytest.raises(TargetError, match=r"127\.0\.0\.1 is a loopback address"):
        await vet(Target("https", "127.0.0.1", 443), (), _resolver())


async def test_a_connection_failure_names_the_host_not_the_address_it_resolved_to() -> None:
    """Transport errors name the pinned address; the outcome says the user's host instead."""

    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connect to ('10.20.3.4', 443) failed", request=request)

    deliverer = _deliverer(handler, "10.20.3.4", allowed=(ipaddress.ip_network("10.20.0.0/16"),))
    outcome = await deliverer.send(
        "https://hooks.example/in", "msg_1", b"{}", [SECRET], 1_700_000_000
    )

    assert outcome.error is not None
    assert "10.20.3.4" not in outcome.error and "hooks.example" in outcome.error


async def test_http_is_refused_unless_allowed() -> None:
    """A plain http URL is refused by default."""
    outcome = await _deliverer(lambda r: httpx.Response(200)).send(
        "http://hooks.example/in", "msg_1", b"{}", [SECRET], 1_700_000_000
    )

    assert outcome.error and "https" in outcome.error


async def test_a_redirect_is_an_answer_not_followed() -> None:
    """A 302 is the outcome (a failure for the caller), nothing more is requested."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(302, headers={"location": "https://elsewhere.example/"})

    outcome = await _deliverer(handler).send(
        "https://hooks.example/in", "msg_1", b"{}", [SECRET], 1_700_000_000
    )

    assert outcome.status == 302
    assert len(seen) == 1


async def test_a_connection_failure_is_an_error_outcome() -> None:
    """Transport errors become data, not exceptions."""

    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    outcome = await _deliverer(handler).send(
        "https://hooks.example/in", "msg_1", b"{}", [SECRET], 1_700_000_000
    )

    assert outcome.status is None and outcome.error and "ConnectError" in outcome.error
