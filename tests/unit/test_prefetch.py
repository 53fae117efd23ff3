"""Machines that open and click (``shared.engagement.prefetch``)."""

from __future__ import annotations

import pytest

from shared.engagement.prefetch import machine

BROWSER = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 Chrome/131.0 Safari/537.36"


@pytest.mark.parametrize(
    ("agent", "ip", "name"),
    [
        (
            "Mozilla/5.0 (Windows NT 5.1; rv:11.0) Gecko Firefox/11.0 "
            "(via ggpht.com GoogleImageProxy)",
            None,
            "Gmail image proxy",
        ),
        (
            "YahooMailProxy; https://help.yahoo.com/kb/yahoo-mail-proxy-SLN28749.html",
            None,
            "Yahoo Mail image proxy",
        ),
        ("Mozilla/5.0", "17.58.0.3", "Apple Mail Privacy Protection"),
        ("python-requests/2.32", "93.184.215.14", "a script"),
        ("", "93.184.215.14", "no user agent"),
    ],
)
def test_known_machines_are_named(agent: str, ip: str | None, name: str) -> None:
    assert machine(agent, ip) == name


def test_a_browser_is_a_reader() -> None:
    assert machine(BROWSER, "93.184.215.14") is None
    assert machine(BROWSER, "not an ip") is None
