"""Statement coverage per package from a coverage data file: ``make cov`` prints this for
the unit suite alone and for the whole suite (the issue's bar: services/consumers and
services/webhooks at 70 % or more from unit tests alone).

Usage: ``python -m tests.coverage_by_package DATAFILE [MINIMUM PACKAGE...]``
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import coverage

ROOT = Path(__file__).resolve().parents[1]


def package_of(path: Path) -> str:
    """``services/consumers``, ``shared/providers``, ``shared``...: a file's package."""
    return path.relative_to(ROOT).parent.as_posix()


def summary(datafile: str) -> dict[str, tuple[int, int]]:
    """``{package: (statements, missed)}``."""
    cov = coverage.Coverage(data_file=datafile)
    cov.load()
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for name in cov.get_data().measured_files():
        if not name.endswith(".py"):
            continue  # compiled templates carry their template's file name
        _, statements, _, missing, _ = cov.analysis2(name)
        package = package_of(Path(name))
        totals[package][0] += len(statements)
        totals[package][1] += len(missing)
    return {k: (v[0], v[1]) for k, v in sorted(totals.items())}


def main(argv: list[str]) -> int:
    datafile, *rest = argv
    minimum = float(rest[0]) if rest else 0.0
    required = set(rest[1:])
    failed = []
    print(f"{'package':<24} {'stmts':>6} {'miss':>6} {'cover':>6}")
    for package, (statements, missed) in summary(datafile).items():
        percent = 100.0 * (statements - missed) / statements if statements else 100.0
        print(f"{package:<24} {statements:>6} {missed:>6} {percent:>5.0f}%")
        if package in required and percent < minimum:
            failed.append(f"{package} {percent:.0f}% < {minimum:.0f}%")
    for line in failed:
        print(f"BELOW THE BAR: {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
