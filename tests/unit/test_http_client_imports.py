"""httpx's transport (httpcore) asks which async library runs at every connection release by
importing ``sniffio``; the consumers release a connection per provider call. With sniffio
missing, each of those imports searches ``sys.path`` on disk (2.9 % of a busy consumer's
samples in ``make bench``'s e2e phase), so the lock file must keep it."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType

from httpcore._synchronization import current_async_library


class Searches(MetaPathFinder):
    """Counts the module searches that reach the import system's finders."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        self.names.append(fullname)
        return None


async def test_asking_which_async_library_runs_searches_for_no_module() -> None:
    """After the first call, httpcore's question is answered from modules already imported."""
    current_async_library()
    searches = Searches()
    sys.meta_path.insert(0, searches)
    try:
        for _ in range(3):
            assert current_async_library() == "asyncio"
    finally:
        sys.meta_path.remove(searches)

    assert searches.names == []
