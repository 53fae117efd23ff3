"""Sending domains, pure rules: names as stored, which verified domains cover a sender, the
TXT record that proves control, and the DNS JSON answers it is read from."""

from __future__ import annotations

import re

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox import dns
from sandbox.zone import TxtRecords
from shared.accounts import domains
from shared.accounts.domains import DohResolver, DomainError
from shared.core.errors import DependencyUnavailable


@pytest.mark.parametrize(
    ("text", "stored"),
    [
        ("Example.COM", "example.com"),
        (" example.com. ", "example.com"),
        ("mail.example.co.uk", "mail.example.co.uk"),
        ("bücher.example", "xn--bcher-kva.example"),
    ],
)
def test_a_domain_is_stored_in_lower_case_ascii(text: str, stored: str) -> None:
    assert domains.normalize_domain(text) == stored


@pytest.mark.parametrize(
    "text",
    [
        "localhost",
        "",
        "example..com",
        "-a.example.com",
        "a_b.example.com",
        "1.2.3.4",
        "exa mple.com",
        "a" * 64 + ".com",
        ("a" * 60 + ".") * 5 + "com",
        "@example.com",
    ],
)
def test_what_is_not_a_domain_name_is_refused(text: str) -> None:
    with pytest.raises(DomainError):
        domains.normalize_domain(text)


@pytest.mark.parametrize(
    ("sender_domain", "covered"),
    [
        ("example.com", True),
        ("news.example.com", True),
        ("a.b.example.com", True),
        ("badexample.com", False),
        ("example.com.evil.net", False),
        ("com", False),
        ("other.org", False),
    ],
)
def test_a_verified_domain_covers_itself_and_its_subdomains_only(
    sender_domain: str, covered: bool
) -> None:
    assert domains.covers(frozenset({"example.com"}), sender_domain) is covered


def test_no_verified_domain_covers_nothing() -> None:
    assert not domains.covers(frozenset(), "example.com")


def test_the_sender_domain_is_the_part_after_the_last_at() -> None:
    assert domains.domain_of('"a@b"@Example.COM') == "example.com"


def test_the_record_is_published_under_its_label_with_the_token() -> None:
    assert domains.record_name("example.com") == "_safedelivr.example.com"
    assert domains.proven([" other", "safedelivr-verification=tok "], "tok")
    assert not domains.proven(["safedelivr-verification=tok2"], "tok")
    assert not domains.proven(["safedelivr-verification=tokx", "tok"], "tok")


def test_txt_strings_join_a_records_character_strings() -> None:
    answer = {
        "Status": 0,
        "Answer": [
            {"type": 16, "data": '"safedelivr-verification=" "abc"'},
            {"type": 5, "data": "alias.example.com."},  # a CNAME on the way is not TXT
            {"type": 16, "data": "unquoted"},
            {"type": 16, "data": 7},
        ],
    }

    assert domains.txt_strings(answer) == ["safedelivr-verification=abc", "unquoted"]


@pytest.mark.parametrize("answer", [None, [], {"Status": 3}, {"Answer": "x"}])
def test_an_answer_without_records_has_no_txt_strings(answer: object) -> None:
    assert domains.txt_strings(answer) == []


def test_the_sandbox_answers_in_the_dns_json_format() -> None:
    records = TxtRecords()
    records.publish("_safedelivr.Example.com.", "v=1")
    records.publish("_safedelivr.example.com", "v=1")  # once only

    answer = dns.doh_answer("_safedelivr.example.com", records.lookup("_SAFEDELIVR.example.com"))

    assert answer["Status"] == dns.NOERROR
    assert domains.txt_strings(answer) == ["v=1"]
    assert dns.doh_answer("nothing.example.com", [])["Status"] == dns.NXDOMAIN


async def test_the_resolver_reads_txt_records_from_a_dns_json_endpoint() -> None:
    seen: list[httpx.Request] = []

    def resolver(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=dns.doh_answer("x.example.com", ["a", "b"]))

    async with httpx.AsyncClient(transport=httpx.MockTransport(resolver)) as http:
        found = await DohResolver(http, "https://dns.test/dns-query").txt("x.example.com")

    assert found == ["a", "b"]
    assert dict(seen[0].url.params) == {"name": "x.example.com", "type": "TXT"}
    assert seen[0].headers["accept"] == "application/dns-json"


@pytest.mark.parametrize(
    "answer",
    [httpx.Response(502), httpx.Response(200, content=b"<html>"), httpx.ConnectError("down")],
)
async def test_a_resolver_that_cannot_answer_is_a_dependency_failure(
    answer: httpx.Response | Exception,
) -> None:
    def resolver(request: httpx.Request) -> httpx.Response:
        if isinstance(answer, Exception):
            raise answer
        return answer

    async with httpx.AsyncClient(transport=httpx.MockTransport(resolver)) as http:
        with pytest.raises(DependencyUnavailable):
            await DohResolver(http, "https://dns.test/dns-query").txt("x.example.com")


# The character-strings a record's data always gave, as a regular expression: the scanner must
# give exactly these (a domain is verified or not as it was).
_QUOTED_AS_WAS = re.compile(r'"((?:[^"\\]|\\.)*)"')


@settings(deadline=None)  # a loaded machine is no failure
@given(st.text(alphabet='"\\a \n', max_size=60))
def test_the_quoted_strings_are_those_the_regular_expression_found(data: str) -> None:
    """The scanner finds the contents ``"((?:[^"\\\\]|\\\\.)*)"`` found, in order."""
    assert domains.quoted_strings(data) == _QUOTED_AS_WAS.findall(data)


def test_a_record_of_a_megabyte_of_escaped_quotes_is_read_as_it_is() -> None:
    """A record's data of an open quote and half a million escaped quotes (the domain
    owner writes it) has no quoted string and is taken as it is, within the suite's per-test
    timeout (the regular expression read the rest of the data for each quote: hours)."""
    data = '"' + '\\"' * 500_000

    assert domains.txt_strings({"Answer": [{"type": 16, "data": data}]}) == [data]
