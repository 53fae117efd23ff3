"""One value in force, replaced whole and never mutated: the owner of a setting that changes
while a process runs (live settings) hands readers this cell, and each reader calls it at the
point of use, so a decision sees one consistent value and every reader the latest one."""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class Current(Generic[T]):
    """The value in force; :meth:`set` replaces it whole (readers call the cell for it)."""

    def __init__(self, value: T) -> None:
        self._value = value

    def __call__(self) -> T:
        return self._value

    def set(self, value: T) -> None:
        self._value = value
