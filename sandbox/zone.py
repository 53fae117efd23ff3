"""The sandbox's DNS zone: TXT records by name, published by tests and ``make run`` and read
by the DNS-over-HTTPS stand-in (``sandbox.dns``)."""

from __future__ import annotations

from collections import defaultdict

#: Records the stand-in keeps per name, and names it keeps (it is for tests and make run).
MAX_VALUES, MAX_NAMES = 20, 10_000


class TxtRecords:
    """TXT records by lower-case name, without the trailing dot."""

    def __init__(self) -> None:
        self._records: defaultdict[str, list[str]] = defaultdict(list)

    def publish(self, name: str, value: str) -> bool:
        key = canonical(name)
        if len(self._records) >= MAX_NAMES and key not in self._records:
            return False
        values = self._records[key]
        if value not in values:
            values[:] = [*values, value][-MAX_VALUES:]
        return True

    def remove(self, name: str) -> None:
        self._records.pop(canonical(name), None)

    def lookup(self, name: str) -> list[str]:
        return list(self._records.get(canonical(name), ()))


def canonical(name: str) -> str:
    """A DNS name as records are kept: lower case, without the root's dot."""
    return name.strip().rstrip(".").lower()
