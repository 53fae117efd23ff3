"""A delivery over real TLS connects to the vetted address while the certificate is checked
against the URL's host name (SNI and Host kept): a local TLS server whose certificate names
``localhost`` only, reached at ``https://localhost:<port>``."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from shared.outbound import outbound_signing
from shared.outbound.hook_delivery import Deliverer
from shared.outbound.ssrf import IPAddress


def _certificate(tmp: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[int, Path, list[bytes]]]:
    cert, key = _certificate(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        seen.append(head + await reader.readexactly(length))
        writer.write(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield port, cert, seen


async def _loopback(host: str, port: int) -> list[IPAddress]:
    return [ipaddress.ip_address("127.0.0.1")]


async def test_a_tls_delivery_goes_to_the_vetted_address_checked_against_the_host_name(
    tls_server: tuple[int, Path, list[bytes]],
) -> None:
    """The certificate names localhost only: the connection to 127.0.0.1 verifies."""
    port, cert, seen = tls_server
    trust = ssl.create_default_context(cafile=str(cert))
    async with httpx.AsyncClient(verify=trust, trust_env=False) as http:
        deliverer = Deliverer(
            http,
            timeout=5,
            allowed=(ipaddress.ip_network("127.0.0.0/8"),),
            resolver=_loopback,
        )
        secret = outbound_signing.new_secret()
        outcome = await deliverer.send(
            f"https://localhost:{port}/in", "msg_tls", b"{}", [secret], 1_700_000_000
        )

    assert outcome.status == 204, outcome.error
    (request,) = seen
    assert f"host: localhost:{port}".encode() in request.lower()


async def test_a_certificate_for_another_name_fails_the_delivery(
    tls_server: tuple[int, Path, list[bytes]],
) -> None:
    """The same server reached as another name does not verify: an error, not a send."""
    port, cert, seen = tls_server
    trust = ssl.create_default_context(cafile=str(cert))
    async with httpx.AsyncClient(verify=trust, trust_env=False) as http:
        deliverer = Deliverer(
            http,
            timeout=5,
            allowed=(ipaddress.ip_network("127.0.0.0/8"),),
            resolver=_loopback,
        )
        outcome = await deliverer.send(
            f"https://hooks.example:{port}/in", "msg_tls", b"{}", ["whsec_" + "A" * 44], 0
        )

    assert outcome.status is None and outcome.error
    assert "certificate" in outcome.error.lower() or "hostname" in outcome.error.lower()
    assert seen == []
