"""The mutation score of ``make mutate``, from mutmut's ``mutmut-cicd-stats.json``.

A mutant is caught when a test failed (killed) or ran too long (timeout); every other verdict
(survived, no tests, suspicious, segfault) counts against the score. Exits 1 when more than
MAX_SURVIVING percent of the mutants were not caught.

Usage: ``python -m tests.mutation_score STATSFILE [MAX_SURVIVING]``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

#: The verdicts that are printed, in mutmut's own words.
VERDICTS = ("killed", "timeout", "survived", "no_tests", "suspicious", "segfault", "skipped")
CAUGHT = ("killed", "timeout")


def score(stats: dict[str, int]) -> tuple[int, int, float]:
    """``(caught, total, surviving percent)``; skipped mutants (never run) are left out."""
    total = stats["total"] - stats.get("skipped", 0)
    caught = sum(stats.get(v, 0) for v in CAUGHT)
    surviving = 100.0 * (total - caught) / total if total else 0.0
    return caught, total, surviving


def main(argv: list[str]) -> int:
    path, *rest = argv
    limit = float(rest[0]) if rest else 100.0
    stats = json.loads(Path(path).read_text())
    print("  ".join(f"{v.replace('_', ' ')} {stats.get(v, 0)}" for v in VERDICTS))
    caught, total, surviving = score(stats)
    line = f"mutation score: {caught}/{total} caught, {surviving:.1f} % surviving"
    if surviving > limit:
        print(f"{line} (ABOVE THE BAR of {limit:g} %)")
        return 1
    print(f"{line} (bar: {limit:g} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
